"""Problem files a user would write, for the loading and `check` tests: a rotary embedding
with a derived dim (half = cols // 2) and a constraint, its reference in a module beside it."""

from __future__ import annotations

from pathlib import Path

ROTARY_MATH = """
import numpy as np


def rotate(inputs):
    x, c, s = inputs["x"], inputs["cosines"], inputs["sines"]
    half = c.shape[1]
    a, b = x[:, :half], x[:, half:]
    return {"y": np.concatenate([a * c - b * s, a * s + b * c], axis=1)}


def magnitudes(inputs, expected):
    x, c, s = inputs["x"], np.abs(inputs["cosines"]), np.abs(inputs["sines"])
    half = c.shape[1]
    a, b = np.abs(x[:, :half]), np.abs(x[:, half:])
    return {"y": np.concatenate([a * c + b * s, a * s + b * c], axis=1)}
"""

ROTARY = """
from kernels.spec import Arg, Cost, Problem
from rotary_math import magnitudes, rotate


def _drawn(rng):
    return (
        {"rows": int(rng.integers(1, 9)), "cols": int(rng.integers(2, 300))},
        {"rows": int(rng.integers(20, 60)), "cols": int(rng.integers(2, 100))},
    )


ROTARY = Problem(
    name="rotary",
    description=(
        "Rotary embedding: y[r, i] = x[r, i] cos[r, i] - x[r, i + half] sin[r, i] and "
        "y[r, i + half] = x[r, i] sin[r, i] + x[r, i + half] cos[r, i]"
    ),
    dims=("rows", "cols"),
    derived={"half": "cols // 2"},
    constraints=("cols % 2 == 0",),
    args=(
        Arg("x", ("rows", "cols")),
        Arg("cosines", ("rows", "half")),
        Arg("sines", ("rows", "half")),
        Arg("y", ("rows", "cols"), output=True),
    ),
    reference=rotate,
    baseline=rotate,
    error_scale=magnitudes,
    test_shapes=({"rows": 1, "cols": 2}, {"rows": 3, "cols": 34}, {"rows": 5, "cols": 130}),
    default_shape={"rows": 64, "cols": 128},
    draw_shapes=_drawn,
    supported_distributions=("normal", "uniform", "ties"),
    nonfinite="not_applicable",
    cost=lambda s: Cost(
        bytes_moved=4 * (2 * s["rows"] * s["cols"] + 2 * s["rows"] * s["half"]),
        flops=6 * s["rows"] * s["half"],
    ),
)
"""

ROTARY_KERNEL = """
#include <stdint.h>
void kernel(const float *x, const float *cosines, const float *sines, float *y,
            int64_t rows, int64_t cols) {
    int64_t half = cols / 2;
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols, *c = cosines + r * half, *s = sines + r * half;
        float *yr = y + r * cols;
        for (int64_t i = 0; i < half; ++i) {
            float a = xr[i], b = xr[i + half];
            yr[i] = a * c[i] - b * s[i];
            yr[i + half] = a * s[i] + b * c[i];
        }
    }
}
"""

WRONG_ROTARY_KERNEL = ROTARY_KERNEL.replace("a * s[i] + b * c[i]", "a * s[i] - b * c[i]")


def write_rotary(folder: Path) -> str:
    """The rotary problem and its sibling module in `folder`; returns `path.py:ROTARY`."""
    (folder / "rotary_math.py").write_text(ROTARY_MATH)
    (folder / "rotary.py").write_text(ROTARY)
    return f"{folder / 'rotary.py'}:ROTARY"
