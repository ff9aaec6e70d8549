"""What the harness costs: `kfactory check PROBLEM --bench` in this tree against another.

Usage:
  git worktree add /tmp/kf-before <commit>
  .venv/bin/python bench/harness_cost.py --before /tmp/kf-before --repeats 5

Runs `kfactory check PROBLEM --target cpu --source kernels/examples/PROBLEM.c --bench --json`
from each tree in turn (this one, then the other, `--repeats` times, alternating so that
both see the same host), with this venv's interpreter and each tree first on the path.
Reports the median wall time of the whole command and the median speedup it measured for
the same kernel, and the ratios after/before. Prints a table; writes
bench/results/harness_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def run_check(tree: Path, problem: str) -> dict[str, Any]:
    source = tree / "kernels" / "examples" / f"{problem}.c"
    command = [
        sys.executable,
        "-c",
        "from ops.cli import main; main()",
        "check",
        problem,
        "--target",
        "cpu",
        "--source",
        str(source),
        "--bench",
        "--json",
    ]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = time.perf_counter()
    out = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    try:
        report = json.loads(out.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise SystemExit(f"{tree}: check printed no report: {out.stderr[-2000:]}") from None
    return {
        "seconds": seconds,
        "verdict": report["verdict"],
        "reason": report.get("reason"),
        "speedup": report.get("speedup"),
        "median_ns": report.get("median_ns"),
        "baseline_ns": report.get("baseline_ns"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--problem", default="softmax")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    trees = {"after": ROOT, "before": args.before.resolve()}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for i in range(args.repeats):
        for name, tree in trees.items():
            result = run_check(tree, args.problem)
            runs[name].append(result)
            print(f"  {i + 1}/{args.repeats} {name}: {result}", file=sys.stderr)
    summary: dict[str, dict[str, float | None]] = {}
    for name, results in runs.items():
        ok = [r for r in results if r["verdict"] == "verified" and r["speedup"]]
        summary[name] = {
            "median_seconds": statistics.median(r["seconds"] for r in results),
            "median_speedup": statistics.median(r["speedup"] for r in ok) if ok else None,
            "median_kernel_ms": statistics.median(r["median_ns"] for r in ok) / 1e6 if ok else None,
            "median_baseline_ms": (
                statistics.median(r["baseline_ns"] for r in ok) / 1e6 if ok else None
            ),
            "verified": len(ok),
            "runs": len(results),
        }
    before, after = summary["before"], summary["after"]
    ratio = {
        "seconds_after_over_before": after["median_seconds"] / before["median_seconds"]  # type: ignore[operator]
        if before["median_seconds"]
        else None,
        "speedup_after_over_before": (
            after["median_speedup"] / before["median_speedup"]
            if after["median_speedup"] and before["median_speedup"]
            else None
        ),
    }
    print(f"kfactory check {args.problem} --bench, {args.repeats} runs each, alternating")
    print(f"{'tree':8} {'median s':>9} {'speedup':>8} {'kernel ms':>10} {'numpy ms':>9} verified")
    for name, s in summary.items():
        speed = f"{s['median_speedup']:.2f}x" if s["median_speedup"] else "-"
        kernel = f"{s['median_kernel_ms']:.2f}" if s["median_kernel_ms"] else "-"
        base = f"{s['median_baseline_ms']:.2f}" if s["median_baseline_ms"] else "-"
        print(
            f"{name:8} {s['median_seconds']:9.1f} {speed:>8} {kernel:>10} {base:>9} "
            f"{s['verified']}/{s['runs']}"
        )
    for key, value in ratio.items():
        print(f"{key}: {value:.2f}" if value else f"{key}: -")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "harness_cost.json").write_text(
        json.dumps({"problem": args.problem, "summary": summary, "ratio": ratio, "runs": runs})
    )


if __name__ == "__main__":
    main()
