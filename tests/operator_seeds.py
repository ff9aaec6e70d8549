"""Plain scalar seeds a user writes, and the small problems they solve, for the tests of the
variation operators (`actors/search/operators`): an L2 norm of rows (the seed of
bench/user_problems.py), a three-pass softmax, a row-wise log-sum-exp, an elementwise
SwiGLU, layernorm and GELU (the built-in problems)."""

from __future__ import annotations

import numpy as np

from actors.search.operators.protocol import ParentKernel
from bench.user_problems import L2NORM_SEED
from kernels.builtin import GELU, LAYERNORM, SOFTMAX
from kernels.spec import Arg, Arrays, Cost, Problem

__all__ = ["GELU", "LAYERNORM", "SOFTMAX"]

SMALL_ROWS = ({"rows": 3, "cols": 37}, {"rows": 1, "cols": 1}, {"rows": 5, "cols": 300})
SEED_FLAGS = ("-O3",)


def _small_rows(rng: np.random.Generator) -> tuple[dict[str, int], ...]:
    return (
        {"rows": int(rng.integers(1, 40)), "cols": int(rng.integers(1, 700))},
        {"rows": int(rng.integers(1, 4)), "cols": int(rng.integers(1000, 3000))},
    )


def _rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m = x.max(axis=1, keepdims=True)
    return m, np.exp(x - m).sum(axis=1, keepdims=True)


def _l2norm(a: Arrays) -> Arrays:
    x = a["x"].astype(np.float64)
    return {"y": x / np.sqrt((x * x).sum(axis=1, keepdims=True) + 1e-12)}


def _lse(a: Arrays) -> Arrays:
    m, s = _rows(a["x"].astype(np.float64))
    return {"y": (m + np.log(s))[:, 0]}


def _lse_scale(i: Arrays, e: Arrays) -> Arrays:
    """m + log(s) cancels where m ~ -log(s): errors are judged against |m| + log(s)."""
    with np.errstate(invalid="ignore"):
        m, s = _rows(i["x"].astype(np.float64))
        return {"y": (np.abs(m) + np.abs(np.log(s)))[:, 0]}


def _swiglu(a: Arrays) -> Arrays:
    x, g = a["a"].astype(np.float64), a["b"].astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return {"y": x / (1.0 + np.exp(-x)) * g}


def _swiglu_scale(i: Arrays, e: Arrays) -> Arrays:
    """silu(a) for a below -87 is below fp32's range (exp(-a) overflows): judged against
    1e-30 |b| as well as |y|."""
    return {"y": np.abs(e["y"]) + 1e-30 * np.abs(i["b"].astype(np.float64))}


L2NORM = Problem(
    name="l2norm_rows",
    description="each row of x divided by its L2 norm",
    dims=("rows", "cols"),
    args=(Arg("x", ("rows", "cols")), Arg("y", ("rows", "cols"), output=True)),
    reference=_l2norm,
    baseline=_l2norm,
    test_shapes=SMALL_ROWS,
    default_shape={"rows": 256, "cols": 2048},
    draw_shapes=_small_rows,
    cost=lambda s: Cost(bytes_moved=8 * s["rows"] * s["cols"], flops=4 * s["rows"] * s["cols"]),
    input_limit=1e15,
)

LOGSUMEXP = Problem(
    name="logsumexp_rows",
    description="y[r] = log(sum_c exp(x[r, c]))",
    dims=("rows", "cols"),
    args=(Arg("x", ("rows", "cols")), Arg("y", ("rows",), output=True)),
    reference=_lse,
    baseline=_lse,
    test_shapes=SMALL_ROWS,
    default_shape={"rows": 256, "cols": 2048},
    draw_shapes=_small_rows,
    error_scale=_lse_scale,
    cost=lambda s: Cost(bytes_moved=4 * s["rows"] * s["cols"], flops=4 * s["rows"] * s["cols"]),
)

SWIGLU = Problem(
    name="swiglu",
    description="y = silu(a) * b, silu(a) = a / (1 + exp(-a))",
    dims=("n",),
    args=(Arg("a", ("n",)), Arg("b", ("n",)), Arg("y", ("n",), output=True)),
    reference=_swiglu,
    baseline=_swiglu,
    test_shapes=({"n": 1}, {"n": 7}, {"n": 1000}),
    default_shape={"n": 1 << 20},
    draw_shapes=lambda rng: ({"n": int(rng.integers(1, 5000))},),
    error_scale=_swiglu_scale,
    cost=lambda s: Cost(bytes_moved=12 * s["n"], flops=6 * s["n"]),
    input_limit=1e15,
)

SOFTMAX3_SEED = """\
#include <math.h>
#include <stdint.h>

/* Softmax over each row in three passes: the max, exp and its sum, the scaling. */
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        float m = -INFINITY;
        for (int64_t j = 0; j < cols; ++j) m = fmaxf(m, x[r * cols + j]);
        float s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) {
            const float e = expf(x[r * cols + j] - m);  // one exp per element
            y[r * cols + j] = e;
            s += e;
        }
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] /= s;
    }
}
"""

LOGSUMEXP_SEED = """\
#include <math.h>
#include <stdint.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *row = x + r * cols;
        float m = -INFINITY;
        for (int64_t j = 0; j < cols; ++j) m = row[j] > m ? row[j] : m;
        float s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) s += expf(row[j] - m);
        y[r] = m + logf(s);
    }
}
"""

SWIGLU_SEED = """\
#include <math.h>
#include <stdint.h>

void kernel(const float *a, const float *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}
"""

LAYERNORM_SEED = """\
#include <math.h>
#include <stdint.h>

void kernel(const float *x, const float *w, const float *b, float *y, int64_t rows,
            int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        float mean = 0.0f;
        for (int64_t j = 0; j < cols; ++j) mean += x[r * cols + j];
        mean /= (float)cols;
        float var = 0.0f;
        for (int64_t j = 0; j < cols; ++j) {
            const float d = x[r * cols + j] - mean;
            var += d * d;
        }
        var /= (float)cols;
        for (int64_t j = 0; j < cols; ++j)
            y[r * cols + j] = (x[r * cols + j] - mean) / sqrtf(var + 1e-5f) * w[j] + b[j];
    }
}
"""

GELU_SEED = """\
#include <math.h>
#include <stdint.h>

void kernel(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
}
"""

SEEDS: dict[str, tuple[Problem, str]] = {
    "l2norm": (L2NORM, L2NORM_SEED),
    "softmax": (SOFTMAX, SOFTMAX3_SEED),
    "logsumexp": (LOGSUMEXP, LOGSUMEXP_SEED),
    "swiglu": (SWIGLU, SWIGLU_SEED),
    "layernorm": (LAYERNORM, LAYERNORM_SEED),
    "gelu": (GELU, GELU_SEED),
}


def seed(name: str, flags: tuple[str, ...] = SEED_FLAGS) -> ParentKernel:
    """The seed as a parent kernel of generation 0."""
    return ParentKernel(f"{name}-seed", SEEDS[name][1], flags)
