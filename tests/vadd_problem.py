"""The tiniest real problem, vector add at small shapes, written into a folder as a user
problem (problem file, template, campaign file), so that fault tests and the soak run
campaigns whose kernels take microseconds and whose bus and store do the work."""

from __future__ import annotations

from pathlib import Path

PROBLEM = """
import numpy as np
from kernels.spec import Arg, Cost, Problem
from kernels.user_spaces import KernelSpace


def _add(a):
    return {"y": a["a"] + a["b"]}


VADD = Problem(
    name="vadd",
    description="y = a + b",
    dims=("n",),
    args=(Arg("a", ("n",)), Arg("b", ("n",)), Arg("y", ("n",), output=True)),
    reference=_add,
    baseline=_add,
    test_shapes=({"n": 1}, {"n": 7}, {"n": 100}),
    default_shape={"n": 4096},
    cost=lambda s: Cost(bytes_moved=12 * s["n"], flops=s["n"]),
)

SPACES = [
    KernelSpace(
        "vadd.c.j2",
        {
            "unroll": [1, 2, 3, 4, 6, 8, 12, 16, 24, 32],
            "flags": ["-O1", "-O2", "-O3", "-O3 -march=native"],
        },
    ),
]
"""

TEMPLATE = """\
#include <stdint.h>
/* {{ template }}: unroll={{ unroll }} */
void kernel(const float *a, const float *b, float *y, int64_t n) {
#pragma GCC unroll {{ unroll }}
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}
"""

CAMPAIGN = """\
name = "{name}"
problem = "vadd.py:VADD"
shapes = [[{n}]]
[budget]
candidates = {budget}
wall_time = "{wall_time}"
stop_at_roofline = 1.5
[search]
per_generation = {per_generation}
seed = {seed}
"""


def vadd_campaign(
    folder: Path,
    name: str,
    budget: int = 4,
    per_generation: int = 2,
    n: int = 4096,
    seed: int = 1,
    wall_time: str = "10m",
) -> Path:
    """Write the problem, its template and a campaign file into `folder`; the campaign file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vadd.py").write_text(PROBLEM)
    (folder / "vadd.c.j2").write_text(TEMPLATE)
    campaign = folder / f"{name}.toml"
    campaign.write_text(
        CAMPAIGN.format(
            name=name,
            budget=budget,
            per_generation=per_generation,
            n=n,
            seed=seed,
            wall_time=wall_time,
        )
    )
    return campaign
