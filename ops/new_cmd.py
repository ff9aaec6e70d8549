"""`kfactory new problem NAME`: the files of an operation of your own, ready to run.

It writes a problem file (a row-wise L2 normalization, to edit into yours), a jinja2
template with a small design space declared in that file, a plain seed kernel, and a
campaign file that searches both. `kfactory run NAME/campaign.toml` runs them as they are.
"""

from __future__ import annotations

import re
from pathlib import Path

import typer

from ops.errors import UserError

app = typer.Typer(help="Write the files of a new problem, ready to check and run.")

_PROBLEM = '''\
"""{name}: each row of x divided by its L2 norm. Edit it into your own operation:
the reference (float64), the baseline (the numpy a user would write), the arguments, the
shapes, the cost model. `kfactory check {name}.py:{attr}` checks a kernel against it."""

import numpy as np

from kernels.spec import Arg, Cost, Problem
from kernels.user_spaces import KernelSpace


def reference(a):
    x = a["x"].astype(np.float64)
    return {{"y": x / np.sqrt((x * x).sum(axis=1, keepdims=True) + 1e-12)}}


def baseline(a):
    x = a["x"]
    return {{"y": x / np.sqrt((x * x).sum(axis=1, keepdims=True) + np.float32(1e-12))}}


{attr} = Problem(
    name="{name}",
    description="y[r, :] = x[r, :] / sqrt(sum_j x[r, j]^2 + 1e-12)",
    dims=("rows", "cols"),
    args=(Arg("x", ("rows", "cols")), Arg("y", ("rows", "cols"), output=True)),
    reference=reference,
    baseline=baseline,
    test_shapes=({{"rows": 3, "cols": 37}}, {{"rows": 1, "cols": 1}}, {{"rows": 8, "cols": 256}}),
    default_shape={{"rows": 512, "cols": 1024}},
    cost=lambda s: Cost(bytes_moved=8 * s["rows"] * s["cols"], flops=4 * s["rows"] * s["cols"]),
    # How a kernel's outputs are judged: |got - expected| <= atol + rtol * scale, per element.
    # input_limit: the largest input magnitude drawn (by the `extreme` and `spread` inputs);
    #   set it where any correct fp32 kernel overflows beyond it. Here the sum of squares.
    #   (A rotary embedding whose sin and cos are inputs wants e.g. input_limit=1e4.)
    input_limit=1e15,
    # tolerances: rtol and atol per dtype; by default rtol 1e-4, atol 1e-30 for fp32, and
    #   bf16/fp16 widened to their rounding. To loosen fp32 alone:
    #   tolerances=tolerances(Tolerance(rtol=1e-3, atol=1e-30)),  # from kernels.spec
    # error_scale: the magnitude each output element's error is judged against. By default
    #   |expected|, but at least the rounding of its row's largest output, so an element
    #   that cancels to almost nothing (a log-sum-exp near 0) is judged by its row. Give one
    #   where the error of a correct kernel follows the inputs, e.g. a dot product's terms:
    #   error_scale=lambda inputs, expected: {{"y": np.abs(inputs["x"]).sum(axis=1)}},
    # make_inputs: your own inputs, in place of the built-in distributions, e.g. a
    #   probability row that sums to 1 (name the distributions it handles in
    #   supported_distributions):
    #   make_inputs=lambda shape, distribution, rng: {{
    #       "x": rng.dirichlet(np.ones(shape["cols"]), shape["rows"]).astype(np.float32)
    #   }},
    #   supported_distributions=("normal",),
)

# The design spaces searched for {attr}: a jinja2 template next to this file. A plain C
# kernel with macro parameters works too: KernelSpace("k.c", {{"BLOCK": [8, 16]}},
# restrictions=["BLOCK <= 16"]); its values are passed as -DBLOCK=...
SPACES = [
    KernelSpace(
        "{name}.c.j2",
        {{
            "lanes": [4, 8, 16],
            "threads": [1, 2],
            "flags": ["-O3 -march=native", "-O3 -march=native -ffast-math"],
        }},
        restrictions=["lanes * threads <= 16"],  # Kernel Tuner style, over the parameters
    ),
]
'''

#: The example's template (a row-wise L2 norm); bench/user_problems.py searches it too.
L2NORM_TEMPLATE = """\
#include <math.h>
#include <stdint.h>
/* {{ template }}: lanes={{ lanes }} threads={{ threads }} */
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
{% if threads > 1 %}
#pragma omp parallel for schedule(static) num_threads({{ threads }})
{% endif %}
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float acc[{{ lanes }}] = {0};
        int64_t j = 0;
        for (; j + {{ lanes }} <= cols; j += {{ lanes }}) {
#pragma omp simd
            for (int k = 0; k < {{ lanes }}; ++k) acc[k] += xr[j + k] * xr[j + k];
        }
        float s = 0.0f;
        for (int k = 0; k < {{ lanes }}; ++k) s += acc[k];
        for (; j < cols; ++j) s += xr[j] * xr[j];
        const float inv = 1.0f / sqrtf(s + 1e-12f);
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] * inv;
    }
}
"""

_SEED = """\
#include <math.h>
#include <stdint.h>

/* The kernel you already have: plain C, one row at a time. */
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        float s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) s += x[r * cols + j] * x[r * cols + j];
        const float inv = 1.0f / sqrtf(s + 1e-12f);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = x[r * cols + j] * inv;
    }
}
"""

_CAMPAIGN = """\
# kfactory run {folder}/campaign.toml
problem = "{name}.py:{attr}"
shapes = [[512, 1024]]

[budget]
candidates = 8
wall_time = "10m"

[search]
per_generation = 4

[seed]
sources = ["{name}_seed.c"]  # verified and timed first, then tuned in a generic space
"""


@app.command("problem")
def new_problem(
    name: str = typer.Argument(..., help="The problem's name: letters, digits and _."),
    folder: Path | None = typer.Option(None, help="Where to write (default: ./NAME)."),
    force: bool = typer.Option(False, help="Overwrite files that exist."),
) -> None:
    """Write NAME.py (problem and spaces), NAME.c.j2 (a template), NAME_seed.c (a seed
    kernel) and campaign.toml into a new folder; then `kfactory run NAME/campaign.toml`."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise UserError(f"problem name {name!r}: use letters, digits and _, not first a digit")
    where = folder if folder is not None else Path(name)
    attr = name.upper()
    files = {
        f"{name}.py": _PROBLEM.format(name=name, attr=attr),
        f"{name}.c.j2": L2NORM_TEMPLATE,
        f"{name}_seed.c": _SEED,
        "campaign.toml": _CAMPAIGN.format(name=name, attr=attr, folder=where),
    }
    existing = [f for f in files if (where / f).exists()]
    if existing and not force:
        raise UserError(f"{where} already holds {', '.join(existing)}; use --force to replace")
    where.mkdir(parents=True, exist_ok=True)
    for file, text in files.items():
        (where / file).write_text(text)
    typer.echo(f"wrote {', '.join(str(where / f) for f in files)}")
    typer.echo(
        f"check the seed: kfactory check {where / name}.py:{attr} --source {where / name}_seed.c"
    )
    typer.echo(f"search:         kfactory run {where / 'campaign.toml'}")


def register(parent: typer.Typer) -> None:
    parent.add_typer(app, name="new")
