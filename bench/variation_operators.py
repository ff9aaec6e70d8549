"""Figures for issue 32: the offline variation operators (`writer.kind = "evolve"`) on
operations none of the templates cover, each from a plain, scalar, single-threaded seed.

Held out: none of these problems is in the tests that tune the operators
(tests/operator_seeds.py). For each, in a fresh temporary folder, this writes the problem
file and the seed, then runs the real command,
`kfactory run --problem FILE:NAME --seed-source seed.c --writer evolve --budget N --json`,
and reads the figures from the campaign's `leaderboard` and `lineage` views: the seed's
own time (its candidate of generation 0, timed in the same campaign), the best kernel's
own time, the best over the seed and over numpy (the baseline timed beside it), and the
operators of the best's lineage. Prints a table and the geometric mean of best over seed;
writes bench/results/variation_operators.json.

Usage:
  .venv/bin/python bench/variation_operators.py                    # 60 candidates each
  .venv/bin/python bench/variation_operators.py --budget 8 --ops softplus,absmax_rows
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from user_problems import _sql  # noqa: E402

RESULTS = ROOT / "bench" / "results"

_HEADER = """
import numpy as np
from kernels.spec import Arg, Cost, Problem

ROWS = (Arg("x", ("rows", "cols")), Arg("y", ("rows", "cols"), output=True))
SHAPES = ({"rows": 3, "cols": 37}, {"rows": 1, "cols": 1}, {"rows": 8, "cols": 300})


def _softplus(x):
    return np.logaddexp(0.0, x)


def rows_problem(name, description, reference, baseline, flops, args=ROWS):
    # a problem over (rows, cols) moving 8 bytes and `flops` flops per element
    return Problem(
        name=name,
        description=description,
        dims=("rows", "cols"),
        args=args,
        reference=reference,
        baseline=baseline,
        test_shapes=SHAPES,
        default_shape={"rows": 256, "cols": 2048},
        cost=lambda s: Cost(
            bytes_moved=8 * s["rows"] * s["cols"], flops=flops * s["rows"] * s["cols"]
        ),
    )
"""

PROBLEMS: dict[str, tuple[str, str]] = {
    "softplus": (
        """
SOFTPLUS = rows_problem(
    "softplus",
    "y = log(1 + exp(x)), elementwise over rows",
    lambda a: {"y": _softplus(a["x"].astype(np.float64))},
    lambda a: {"y": np.logaddexp(np.float32(0), a["x"])},
    4,
)
""",
        """\
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
            float v = x[r * cols + j];
            y[r * cols + j] = v > 20.0f ? v : log1pf(expf(v));
        }
    }
}
""",
    ),
    "mish": (
        """
MISH = rows_problem(
    "mish",
    "y = x * tanh(softplus(x)), elementwise over rows",
    lambda a: {"y": (lambda x: x * np.tanh(_softplus(x)))(a["x"].astype(np.float64))},
    lambda a: {"y": a["x"] * np.tanh(np.logaddexp(np.float32(0), a["x"]))},
    8,
)
""",
        """\
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
            float v = x[r * cols + j];
            float sp = v > 20.0f ? v : log1pf(expf(v));
            y[r * cols + j] = v * tanhf(sp);
        }
    }
}
""",
    ),
    "absmax_rows": (
        """
def _absmax(x):
    return x / np.maximum(np.abs(x).max(axis=1, keepdims=True), 1e-30)


ABSMAX_ROWS = rows_problem(
    "absmax_rows",
    "each row divided by its largest magnitude",
    lambda a: {"y": _absmax(a["x"].astype(np.float64))},
    lambda a: {"y": _absmax(a["x"])},
    3,
)
""",
        """\
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        float m = 0.0f;
        for (int64_t j = 0; j < cols; ++j) {
            float a = fabsf(x[r * cols + j]);
            if (a > m || a != a) m = a; /* a NaN makes the row NaN, as in numpy */
        }
        if (m < 1e-30f) m = 1e-30f;
        for (int64_t j = 0; j < cols; ++j) {
            y[r * cols + j] = x[r * cols + j] / m;
        }
    }
}
""",
    ),
    "rmsnorm_scale": (
        """
def _rms(x, w):
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * (1.0 + w)


RMSNORM_SCALE = rows_problem(
    "rmsnorm_scale",
    "RMS norm of each row, scaled by (1 + w) per column",
    lambda a: {"y": _rms(a["x"].astype(np.float64), a["w"].astype(np.float64))},
    lambda a: {"y": _rms(a["x"], a["w"])},
    5,
    args=(Arg("x", ("rows", "cols")), Arg("w", ("cols",)), Arg("y", ("rows", "cols"), output=True)),
)
""",
        """\
#include <math.h>
#include <stdint.h>
void kernel(const float *x, const float *w, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        double s = 0.0;
        for (int64_t j = 0; j < cols; ++j) {
            s += (double)x[r * cols + j] * x[r * cols + j];
        }
        float inv = (float)(1.0 / sqrt(s / cols + 1e-6));
        for (int64_t j = 0; j < cols; ++j) {
            y[r * cols + j] = x[r * cols + j] * inv * (1.0f + w[j]);
        }
    }
}
""",
    ),
}


def _attr(name: str) -> str:
    return name.upper()


def run_op(
    name: str, budget: int, per_generation: int, shape: str, keep: Path | None
) -> dict[str, Any]:
    problem, seed = PROBLEMS[name]
    with tempfile.TemporaryDirectory(prefix=f"kf-evolve-{name}-") as folder_text:
        folder = Path(folder_text) if keep is None else keep / name
        if keep is not None:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        (folder / f"{name}.py").write_text(_HEADER + problem)
        (folder / "seed.c").write_text(seed)
        home = folder / "home"
        command = [
            sys.executable, "-m", "ops.cli", "run",
            "--problem", f"{folder / name}.py:{_attr(name)}",
            "--seed-source", str(folder / "seed.c"), "--writer", "evolve",
            "--budget", str(budget), "--per-generation", str(per_generation),
            "--shapes", shape, "--wall-time", "60m", "--name", f"evolve-{name}",
            "--home", str(home), "--json",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=7200, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"{name}: kfactory run failed:\n{done.stderr[-3000:]}")
        return summarize(name, home)


def summarize(name: str, home: Path) -> dict[str, Any]:
    """The figures of a finished campaign, from its leaderboard and lineage views."""
    board = _sql(
        home,
        "SELECT candidate_id, median_ns, speedup, template FROM leaderboard ORDER BY median_ns",
    )
    seed = [r for r in board if str(r["candidate_id"]).endswith(":g0:c0")]
    if not seed or not board:
        raise SystemExit(f"{name}: the seed as it is was not timed")
    best = board[0]
    lineage = {
        str(r["candidate_id"]): r
        for r in _sql(home, "SELECT candidate_id, operator, parents FROM lineage")
    }
    steps: list[str] = []
    current = lineage.get(str(best["candidate_id"]))
    while current is not None and _parents(current):
        steps.append(str(current["operator"]))
        current = lineage.get(_parents(current)[0])
    rejected = _sql(home, "SELECT operator, count(*) AS n FROM rejections GROUP BY operator")
    return {
        "op": name,
        "candidates_timed": len(board),
        "seed_ns": seed[0]["median_ns"],
        "best_ns": best["median_ns"],
        "best_candidate": best["candidate_id"],
        "best_lineage": list(reversed(steps)),
        "best_over_seed": seed[0]["median_ns"] / best["median_ns"],
        "best_over_numpy": best["speedup"],
        "rejected_by_operator": {str(r["operator"]): r["n"] for r in rejected},
    }


def _parents(row: dict[str, Any]) -> list[str]:
    """A lineage row's parents, as `kfactory sql -f json` gives a VARCHAR[] (a list, or its
    text)."""
    parents = row["parents"]
    if isinstance(parents, str):
        parents = json.loads(parents.replace("'", '"')) if parents.strip("[] ") else []
    return [str(p) for p in parents or []]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--per-generation", type=int, default=6)
    parser.add_argument("--shape", default="256x2048")
    parser.add_argument("--ops", default=",".join(PROBLEMS))
    parser.add_argument("--out", type=Path, default=RESULTS / "variation_operators.json")
    parser.add_argument(
        "--keep", type=Path, help="keep each campaign's folder (its store) under this one"
    )
    args = parser.parse_args()
    results = [
        run_op(name, args.budget, args.per_generation, args.shape, args.keep)
        for name in args.ops.split(",")
    ]
    print(f"{'op':14} {'seed ms':>9} {'best ms':>9} {'best/seed':>9} {'x numpy':>8}  lineage")
    for r in results:
        print(
            f"{r['op']:14} {r['seed_ns'] / 1e6:>9.3f} {r['best_ns'] / 1e6:>9.3f} "
            f"{r['best_over_seed']:>9.2f} {r['best_over_numpy']:>8.2f}  "
            f"{' > '.join(r['best_lineage']) or 'the seed'}"
        )
    geomean = math.exp(sum(math.log(r["best_over_seed"]) for r in results) / len(results))
    print(f"geometric mean of best over seed: {geomean:.2f}x ({args.budget} candidates each)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"budget": args.budget, "shape": args.shape, "geomean_best_over_seed": geomean}
    args.out.write_text(json.dumps({**summary, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
