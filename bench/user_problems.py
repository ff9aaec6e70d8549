"""Figures for issue 12: operations the package does not ship, searched from the user's files.

For each operation (a row-wise L2 normalization and a 1-D 5-point stencil) this writes,
in a fresh temporary folder, a problem file with a small jinja2 template of its own
(declared in the file's SPACES), a plain scalar seed kernel and a campaign file with
`[seed] sources`; then runs the real command, `kfactory run FILE --home H --json`, for a
campaign of 24 candidates. From the recorded BenchmarkCompleted events it reports the
best kernel's median time, its speedup over the seed as it is (the seed's own candidate
of generation 0, timed in the same campaign) and over numpy (the baseline timed beside
it). Prints a table; writes bench/results/user_problems.json.

Usage:
  .venv/bin/python bench/user_problems.py                 # 24 candidates each
  .venv/bin/python bench/user_problems.py --budget 8 --ops l2norm
  .venv/bin/python bench/user_problems.py --ops stencil5 --out bench/results/stencil5.json
  .venv/bin/python bench/user_problems.py --ops l2norm --from-home l2norm=/tmp/H  # summarize
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ops.new_cmd import L2NORM_TEMPLATE

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

L2NORM_PROBLEM = """
import numpy as np
from kernels.spec import Arg, Cost, Problem
from kernels.user_spaces import KernelSpace


def _reference(a):
    x = a["x"].astype(np.float64)
    return {"y": x / np.sqrt((x * x).sum(axis=1, keepdims=True) + 1e-12)}


def _numpy(a):
    x = a["x"]
    return {"y": x / np.sqrt((x * x).sum(axis=1, keepdims=True) + np.float32(1e-12))}


L2NORM = Problem(
    name="l2norm_rows",
    description="each row of x divided by its L2 norm",
    dims=("rows", "cols"),
    args=(Arg("x", ("rows", "cols")), Arg("y", ("rows", "cols"), output=True)),
    reference=_reference,
    baseline=_numpy,
    test_shapes=({"rows": 3, "cols": 37}, {"rows": 1, "cols": 1}, {"rows": 8, "cols": 300}),
    default_shape={"rows": 256, "cols": 2048},
    cost=lambda s: Cost(bytes_moved=8 * s["rows"] * s["cols"], flops=4 * s["rows"] * s["cols"]),
    input_limit=1e15,
)

SPACES = [
    KernelSpace(
        "l2norm.c.j2",
        {
            "lanes": [4, 8, 16, 32],
            "threads": [1, 2],
            "flags": ["-O3", "-O3 -march=native", "-O3 -march=native -ffast-math"],
        },
        restrictions=["lanes <= 8 or 'march' in flags"],
    ),
]
"""


L2NORM_SEED = """\
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        float s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) s += x[r * cols + j] * x[r * cols + j];
        const float inv = 1.0f / sqrtf(s + 1e-12f);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = x[r * cols + j] * inv;
    }
}
"""

STENCIL_PROBLEM = '''
import numpy as np
from kernels.spec import Arg, Cost, Problem
from kernels.user_spaces import KernelSpace

WEIGHTS = (-1.0 / 16, 4.0 / 16, 10.0 / 16, 4.0 / 16, -1.0 / 16)


def _terms(x):
    n = x.shape[0]
    return [x[k : n - 4 + k] for k in range(5)]


def _reference(a):
    x = a["x"].astype(np.float64)
    y = x.copy()
    if x.shape[0] > 4:
        y[2:-2] = sum(w * t for w, t in zip(WEIGHTS, _terms(x)))
    return {"y": y}


def _numpy(a):
    x = a["x"]
    y = x.copy()
    if x.shape[0] > 4:
        y[2:-2] = sum(np.float32(w) * t for w, t in zip(WEIGHTS, _terms(x)))
    return {"y": y}


def _scale(i, e):
    """The sum of the terms' magnitudes: a correct fp32 stencil errs relative to it."""
    x = np.abs(i["x"].astype(np.float64))
    s = x.copy()
    if x.shape[0] > 4:
        s[2:-2] = sum(abs(w) * t for w, t in zip(WEIGHTS, _terms(x)))
    return {"y": s}


STENCIL5 = Problem(
    name="stencil5",
    description="y[i] = (-x[i-2] + 4 x[i-1] + 10 x[i] + 4 x[i+1] - x[i+2]) / 16; "
    "the two elements at each end are copied",
    dims=("n",),
    args=(Arg("x", ("n",)), Arg("y", ("n",), output=True)),
    reference=_reference,
    baseline=_numpy,
    test_shapes=({"n": 1}, {"n": 4}, {"n": 5}, {"n": 1001}),
    default_shape={"n": 1 << 20},
    cost=lambda s: Cost(bytes_moved=8 * s["n"], flops=9 * s["n"]),
    error_scale=_scale,
    input_limit=1e37,  # 10 x[i] of the plain seed stays finite in fp32
)

SPACES = [
    KernelSpace(
        "stencil5.c.j2",
        {
            "chunk": [2048, 16384, 131072],
            "threads": [1, 2],
            "flags": ["-O3", "-O3 -march=native", "-O3 -march=native -ffast-math"],
        },
        restrictions=["threads == 2 or chunk == 16384"],
    ),
]
'''

STENCIL_TEMPLATE = """\
#include <stdint.h>
/* {{ template }}: chunk={{ chunk }} threads={{ threads }} */
void kernel(const float *x, float *restrict y, int64_t n) {
    if (n <= 4) {
        for (int64_t i = 0; i < n; ++i) y[i] = x[i];
        return;
    }
    y[0] = x[0]; y[1] = x[1]; y[n - 2] = x[n - 2]; y[n - 1] = x[n - 1];
{% if threads > 1 %}
#pragma omp parallel for schedule(static) num_threads({{ threads }})
{% endif %}
    for (int64_t start = 2; start < n - 2; start += {{ chunk }}) {
        const int64_t end = start + {{ chunk }} < n - 2 ? start + {{ chunk }} : n - 2;
#pragma omp simd
        for (int64_t i = start; i < end; ++i)
            y[i] = -0.0625f * x[i - 2] + 0.25f * x[i - 1] + 0.625f * x[i]
                 + 0.25f * x[i + 1] - 0.0625f * x[i + 2];
    }
}
"""

STENCIL_SEED = """\
#include <stdint.h>
void kernel(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        if (i < 2 || i >= n - 2) {
            y[i] = x[i];
        } else {
            y[i] = (-x[i - 2] + 4.0f * x[i - 1] + 10.0f * x[i] + 4.0f * x[i + 1] - x[i + 2])
                 / 16.0f;
        }
    }
}
"""

OPS: dict[str, dict[str, str]] = {
    "l2norm": {
        "problem": L2NORM_PROBLEM,
        "attr": "L2NORM",
        "template_file": "l2norm.c.j2",
        "template": L2NORM_TEMPLATE,
        "seed": L2NORM_SEED,
        "shape": "[256, 2048]",
    },
    "stencil5": {
        "problem": STENCIL_PROBLEM,
        "attr": "STENCIL5",
        "template_file": "stencil5.c.j2",
        "template": STENCIL_TEMPLATE,
        "seed": STENCIL_SEED,
        "shape": "[1048576]",
    },
}

CAMPAIGN = """\
name = "{name}"
problem = "{name}.py:{attr}"
shapes = [{shape}]
[budget]
candidates = {budget}
wall_time = "40m"
stop_at_roofline = 1.5
[search]
per_generation = {per_generation}
seed = 1
[seed]
sources = ["{name}_seed.c"]
"""


def _sql(home: Path, query: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", "sql", query, "-f", "json", "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    )
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def write_files(name: str, folder: Path, budget: int, per_generation: int) -> Path:
    """The problem, template, seed and campaign files of one operation; the campaign file."""
    op = OPS[name]
    (folder / f"{name}.py").write_text(op["problem"])
    (folder / op["template_file"]).write_text(op["template"])
    (folder / f"{name}_seed.c").write_text(op["seed"])
    campaign = folder / "campaign.toml"
    campaign.write_text(
        CAMPAIGN.format(
            name=name,
            attr=op["attr"],
            shape=op["shape"],
            budget=budget,
            per_generation=per_generation,
        )
    )
    return campaign


def summarize(name: str, home: Path) -> dict[str, Any]:
    """The figures of a finished campaign, from its recorded BenchmarkCompleted events."""
    rows = _sql(
        home,
        "SELECT b.payload->>'candidate_id' AS candidate, w.payload->>'template' AS template, "
        "w.payload->'params' AS params, "
        "CAST(b.payload->>'median_ns' AS DOUBLE) AS median_ns, "
        "CAST(b.payload->>'speedup' AS DOUBLE) AS speedup "
        "FROM events b JOIN events w "
        "ON b.payload->>'candidate_id' = w.payload->>'candidate_id' "
        "WHERE b.type = 'BenchmarkCompleted' AND w.type = 'KernelWritten'",
    )
    wall = _sql(
        home,
        "SELECT epoch(max(ts)) - epoch(min(ts)) AS s FROM events "
        "WHERE type IN ('CampaignStarted', 'CampaignFinished')",
    )
    seed_rows = [
        r
        for r in rows
        if r["template"].split("@")[0] == f"seed_{name}_seed" and r["candidate"].endswith(":g0:c0")
    ]
    if not seed_rows:
        raise SystemExit(f"{name}: the seed as it is was not timed")
    seed = seed_rows[0]
    best = min(rows, key=lambda r: r["median_ns"])
    return {
        "op": name,
        "candidates_timed": len(rows),
        "campaign_wall_s": round(float(wall[0]["s"] or 0.0), 1),
        "seed_ns": seed["median_ns"],
        "seed_over_numpy": seed["speedup"],
        "best_ns": best["median_ns"],
        "best_candidate": best["candidate"],
        "best_template": best["template"],
        "best_params": json.loads(best["params"]),
        "best_over_seed": seed["median_ns"] / best["median_ns"],
        "best_over_numpy": best["speedup"],
    }


def run_op(name: str, budget: int, per_generation: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"kf-{name}-") as folder_text:
        folder = Path(folder_text)
        campaign = write_files(name, folder, budget, per_generation)
        home = folder / "home"
        done = subprocess.run(
            [sys.executable, "-m", "ops.cli", "run", str(campaign), "--home", str(home), "--json"],
            capture_output=True,
            text=True,
            timeout=7200,
            cwd=ROOT,
        )
        if done.returncode != 0:
            raise SystemExit(f"{name}: kfactory run failed:\n{done.stderr[-3000:]}")
        return summarize(name, home)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=24)
    parser.add_argument("--per-generation", type=int, default=8)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument(
        "--from-home",
        action="append",
        default=[],
        metavar="OP=HOME",
        help="summarize a campaign already run into HOME instead of running OP",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "user_problems.json")
    args = parser.parse_args()
    homes = dict(item.split("=", 1) for item in args.from_home)
    results = [
        summarize(name, Path(homes[name]))
        if name in homes
        else run_op(name, args.budget, args.per_generation)
        for name in args.ops.split(",")
    ]
    print(
        f"{'op':10} {'timed':>5} {'seed us':>9} {'best us':>9} {'x seed':>7} {'x numpy':>8}  "
        "best point"
    )
    for r in results:
        print(
            f"{r['op']:10} {r['candidates_timed']:>5} {r['seed_ns'] / 1e3:>9.1f} "
            f"{r['best_ns'] / 1e3:>9.1f} {r['best_over_seed']:>7.2f} {r['best_over_numpy']:>8.2f}"
            f"  {r['best_template']} {r['best_params']}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"budget": args.budget, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
