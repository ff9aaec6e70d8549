"""Self-improvement: does a campaign learn from an earlier one on the same problem?

Usage:
  .venv/bin/python bench/self_improvement.py                    # budget 32, seeds 1..3
  .venv/bin/python bench/self_improvement.py --budget 24 --seeds 1

For each seed, three real campaigns run through `kfactory run FILE --home H --json`:
  warm-up: softmax at shape A in home H1 (cold);
  warm:    softmax at shape B in the SAME home H1, under another campaign name, so its
           planner replays campaign A's candidates and lessons (the dedupe index is per
           shape, so it may evaluate the same parameters again at the new shape);
  cold:    softmax at shape B in a fresh home H2.
For the two shape-B campaigns, the per-candidate outcomes are read back from the events
with `kfactory sql ... --home H -f json`, in the order they were recorded (a rejection
counts as speedup 0), and the number of evaluations each needed to reach 95% of its own
best is counted. The stop at the roofline is switched off (1.5) so both spend the whole
budget. Prints a table of medians over the seeds; writes bench/results/self_improvement.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
KFACTORY = ROOT / ".venv" / "bin" / "kfactory"

OUTCOMES_SQL = """
SELECT position, type,
       payload->>'candidate_id' AS candidate_id,
       CAST(payload->>'speedup' AS DOUBLE) AS speedup
FROM events
WHERE campaign_id = '{campaign}' AND type IN ('BenchmarkCompleted', 'KernelRejected')
ORDER BY position
"""


def _campaign(name: str, shape: list[int], budget: int, per_generation: int, seed: int) -> str:
    return (
        f'name    = "{name}"\n'
        'problem = "softmax"\n'
        'target  = "cpu"\n'
        f"shapes  = [{json.dumps(shape)}]\n\n"
        "[budget]\n"
        f"candidates = {budget}\n"
        'wall_time  = "2h"\n'
        "stop_at_roofline = 1.5\n\n"
        "[search]\n"
        f"per_generation = {per_generation}\n"
        f"seed = {seed}\n"
    )


def run(home: Path, name: str, shape: list[int], args: argparse.Namespace, seed: int) -> float:
    file = home.parent / f"{name}.toml"
    file.write_text(_campaign(name, shape, args.budget, args.per_generation, seed))
    started = time.monotonic()
    subprocess.run(
        [str(KFACTORY), "run", str(file), "--home", str(home), "--json"],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return time.monotonic() - started


def outcomes(home: Path, campaign: str) -> list[float]:
    """Each evaluated candidate's speedup (0 if rejected), in the order recorded."""
    proc = subprocess.run(
        [KFACTORY, "sql", OUTCOMES_SQL.format(campaign=campaign), "--home", home, "-f", "json"],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    rows: list[dict[str, Any]] = json.loads(proc.stdout)
    seen: set[str] = set()
    speedups: list[float] = []
    for row in rows:
        if row["candidate_id"] in seen:
            continue
        seen.add(row["candidate_id"])
        speedups.append(float(row["speedup"] or 0.0) if row["type"] == "BenchmarkCompleted" else 0)
    return speedups


def to_reach(speedups: list[float], fraction: float) -> int | None:
    if not speedups or max(speedups) <= 0:
        return None
    goal = fraction * max(speedups)
    return next(i for i, s in enumerate(speedups, 1) if s >= goal)


def _shape(text: str) -> list[int]:
    return [int(v) for v in text.lower().split("x")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape-a", default="1024x4096")
    parser.add_argument("--shape-b", default="4096x1024")
    parser.add_argument("--budget", type=int, default=32)
    parser.add_argument("--per-generation", type=int, default=8)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated search seeds")
    parser.add_argument("--fraction", type=float, default=0.95)
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="reprint from bench/results/self_improvement.json without running campaigns",
    )
    args = parser.parse_args()
    shape_a, shape_b = _shape(args.shape_a), _shape(args.shape_b)

    runs: list[dict[str, Any]] = []
    if args.from_results:
        saved = json.loads((RESULTS / "self_improvement.json").read_text())
        runs = saved["runs"]
        args.budget, args.per_generation = saved["budget"], saved["per_generation"]
        args.seeds = ",".join(str(r["seed"]) for r in runs)
        shape_a, shape_b = saved["shape_a"], saved["shape_b"]
        args.shape_a, args.shape_b = ("x".join(map(str, s)) for s in (shape_a, shape_b))
    for seed in [] if args.from_results else [int(s) for s in args.seeds.split(",")]:
        with tempfile.TemporaryDirectory(prefix="kf-self-") as tmp:
            warm_home, cold_home = Path(tmp) / "warm" / "home", Path(tmp) / "cold" / "home"
            warm_home.parent.mkdir(parents=True)
            cold_home.parent.mkdir(parents=True)
            name_a, name_b = f"si-a-s{seed}", f"si-b-s{seed}"
            wall_a = run(warm_home, name_a, shape_a, args, seed)
            wall_warm = run(warm_home, name_b, shape_b, args, seed)
            wall_cold = run(cold_home, name_b, shape_b, args, seed)
            warm = outcomes(warm_home, name_b)
            cold = outcomes(cold_home, name_b)
            first = outcomes(warm_home, name_a)
        row = {
            "seed": seed,
            "a_best": max(first, default=0.0),
            "warm_best": max(warm, default=0.0),
            "cold_best": max(cold, default=0.0),
            "warm_to_reach": to_reach(warm, args.fraction),
            "cold_to_reach": to_reach(cold, args.fraction),
            "warm_evaluated": len(warm),
            "cold_evaluated": len(cold),
            "warm_speedups": warm,
            "cold_speedups": cold,
            "wall_s": {"a": wall_a, "warm": wall_warm, "cold": wall_cold},
        }
        runs.append(row)
        print(
            f"seed {seed}: warm reached 95% of {row['warm_best']:.2f}x after "
            f"{row['warm_to_reach']}, cold reached 95% of {row['cold_best']:.2f}x after "
            f"{row['cold_to_reach']} ({wall_a + wall_warm + wall_cold:.0f} s)",
            flush=True,
        )

    for r in runs:  # a less noisy sign than the 95% count: the first generation's mean
        r["warm_first_generation_mean"] = statistics.mean(
            r["warm_speedups"][: args.per_generation] or [0.0]
        )
        r["cold_first_generation_mean"] = statistics.mean(
            r["cold_speedups"][: args.per_generation] or [0.0]
        )

    def med(key: str) -> float | None:
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else None

    warm_med, cold_med = med("warm_to_reach"), med("cold_to_reach")
    met = warm_med is not None and cold_med is not None and warm_med < cold_med
    report = {
        "problem": "softmax",
        "shape_a": shape_a,
        "shape_b": shape_b,
        "budget": args.budget,
        "per_generation": args.per_generation,
        "fraction": args.fraction,
        "runs": runs,
        "warm_median_to_reach": warm_med,
        "cold_median_to_reach": cold_med,
        "target_met": met,
        "warm_median_first_generation_mean": med("warm_first_generation_mean"),
        "cold_median_first_generation_mean": med("cold_first_generation_mean"),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "self_improvement.json").write_text(json.dumps(report, indent=2) + "\n")

    a_text, b_text = args.shape_a, args.shape_b
    print(
        f"\nself-improvement: softmax, {a_text} then {b_text} in one home vs {b_text} cold; "
        f"budget {args.budget}, {args.per_generation} per generation, seeds {args.seeds}"
    )
    print(
        f"{'seed':>4} {'warm: to 95%':>13} {'best':>7} {'gen-0 mean':>11} "
        f"{'cold: to 95%':>13} {'best':>7} {'gen-0 mean':>11}"
    )
    for r in runs:
        print(
            f"{r['seed']:>4} {r['warm_to_reach'] or '-':>13} {r['warm_best']:>6.2f}x "
            f"{r['warm_first_generation_mean']:>10.2f}x "
            f"{r['cold_to_reach'] or '-':>13} {r['cold_best']:>6.2f}x "
            f"{r['cold_first_generation_mean']:>10.2f}x"
        )
    print(f"median evaluations to 95% of own best: warm {warm_med}, cold {cold_med}")
    print(
        f"median first-generation mean speedup: warm "
        f"{report['warm_median_first_generation_mean']:.2f}x, "
        f"cold {report['cold_median_first_generation_mean']:.2f}x"
    )
    print(f"target: warm needs fewer than cold: {'met' if met else 'MISSED'}")


if __name__ == "__main__":
    main()
