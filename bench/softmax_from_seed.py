"""Issue 32's softmax figure: offline variation operators (`--writer evolve`) from a plain,
scalar, single-threaded three-pass softmax, against the template campaign's best, timed
side by side in one interleaved run.

In a fresh folder, with the real commands: a template campaign on the built-in softmax
(`kfactory run --problem softmax`, the default writer), and an evolve campaign from the
seed below (`--seed-source seed.c --writer evolve`), the same budget and shape each; then
`kfactory best` of each. The two bests, the seed and numpy are then timed in one neutral
interleaved run (bench/native_harness.py: every contender once per round, the order
rotating), each output checked against the float64 reference first. The figure is the
median of the per-round ratios template best / evolve best (>= 0.8 is the issue's goal).
Prints a table and writes bench/results/softmax_from_seed.json.

Usage:
  .venv/bin/python bench/softmax_from_seed.py                        # 60 candidates each
  .venv/bin/python bench/softmax_from_seed.py --budget 12 --shape 256x2048 --rounds 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from native_harness import (  # noqa: E402
    Workload,
    compile_library,
    interleaved,
    load_average,
    native_call,
    summary,
    timed,
)
from softmax_limit import source_library  # noqa: E402

from kernels.builtin import BUILTIN  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SEED = """\
#include <math.h>
#include <stdint.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        float m = -INFINITY;
        for (int64_t j = 0; j < cols; ++j) {
            if (x[r * cols + j] > m) m = x[r * cols + j];
        }
        float s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) {
            y[r * cols + j] = expf(x[r * cols + j] - m);
            s += y[r * cols + j];
        }
        for (int64_t j = 0; j < cols; ++j) {
            y[r * cols + j] = y[r * cols + j] / s;
        }
    }
}
"""


def kfactory(*args: str) -> str:
    command = [sys.executable, "-m", "ops.cli", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=7200, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"kfactory {' '.join(args[:3])} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def campaign_best(folder: Path, name: str, budget: int, shape: str, extra: list[str]) -> Path:
    """Run one campaign in `folder` and write its best kernel to `folder/NAME.c`."""
    home = folder / "home"
    kfactory(
        "run", "--problem", "softmax", "--budget", str(budget), "--shapes", shape,
        "--wall-time", "90m", "--name", name, "--home", str(home), "--json", *extra,
    )  # fmt: skip
    best = folder / f"{name}.c"
    kfactory("best", name, "--home", str(home), "-o", str(best))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--shape", default="1024x4096")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds")
    parser.add_argument("--out", type=Path, default=RESULTS / "softmax_from_seed.json")
    args = parser.parse_args()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="kf-softmax-seed-") as folder_text:
        folder = Path(folder_text)
        seed = folder / "seed.c"
        seed.write_text(SEED)
        print(f"template campaign, {args.budget} candidates at {args.shape} ...", flush=True)
        template = campaign_best(folder, "softmax-template", args.budget, args.shape, [])
        print(f"evolve campaign from the seed, {args.budget} candidates ...", flush=True)
        evolve = campaign_best(
            folder,
            "softmax-evolve",
            args.budget,
            args.shape,
            ["--seed-source", str(seed), "--writer", "evolve"],
        )
        rows, cols = (int(v) for v in args.shape.split("x"))
        spec = BUILTIN["softmax"]
        workload = Workload(spec, {"rows": rows, "cols": cols})
        contenders = {
            "template_best": native_call(source_library(template, "template_best"), workload),
            "evolve_best": native_call(source_library(evolve, "evolve_best"), workload),
            "seed": native_call(compile_library("seed", SEED, ("-O3",)), workload),
            "numpy": timed(lambda i: spec.baseline(workload.inputs[i]), workload),
        }
        errors = {}
        for name, call in contenders.items():
            call(0)
            errors[name] = workload.max_rel_error(0) if name != "numpy" else 0.0
        loads = {"before": load_average()}
        samples = interleaved(contenders, args.rounds, workload.sets)
        loads["after"] = load_average()
        sources = {"template_best": template.read_text(), "evolve_best": evolve.read_text()}
    table = summary(samples, "template_best")
    print(f"\n{'kernel':14} {'median ms':>10} {'IQR ms':>15} {'template/this':>14} {'err':>9}")
    for name, row in sorted(table.items(), key=lambda kv: kv[1]["median_ms"]):
        print(
            f"{name:14} {row['median_ms']:10.3f} {row['q1_ms']:7.3f}-{row['q3_ms']:<7.3f} "
            f"{row['speedup_vs_reference']:13.2f}x {errors[name]:9.1e}"
        )
    figure = table["evolve_best"]["speedup_vs_reference"]
    print(f"evolve best at {figure:.2f}x the template best's speed (goal >= 0.8); load {loads}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "budget": args.budget,
                "shape": args.shape,
                "evolve_over_template": figure,
                "interleaved": table,
                "max_rel_error": errors,
                "load_average": loads,
                "seconds": time.time() - started,
                "sources": sources,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
