"""Self-improvement: does a campaign cost less when an earlier campaign of the same problem
ran at another shape? Warm start against cold start, in evaluations to reach 95% of the
exhaustive best.

Usage:
  .venv/bin/python bench/space_table.py --template softmax_rows    # measure once
  .venv/bin/python bench/self_improvement.py                            # replay, 5 seeds

The space was measured exhaustively once on this host at both shapes
(`bench/space_table.py`; the table is cached under bench/results/). For each seed, the
planner's `TemplateSearch` is replayed against that table (`bench/search_replay.py`):
- earlier: a campaign at shape A, searched cold for `--budget` evaluations;
- warm:    a campaign at shape B whose history holds the earlier campaign (its prior);
- cold:    the same campaign at shape B with nothing before it.
Each B campaign runs until one of its points reaches 95% of the best at B in the table,
and the count of evaluations it took is compared: the median over the seeds, warm over
cold. The goal is the exhaustive best, not each campaign's own best (a campaign that
finds nothing good would reach 95% of its own best at once). Nothing is timed in this
script; the output says so.

Prints a table; writes bench/results/self_improvement_<objective>.json (`--objective`:
the ratio over the reference point timed in the same rounds, or the own median).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from search_replay import Campaign, column, replay_arguments, search, spaces_of, table_facts  # noqa: E402
from space_table import RESULTS, load_table, table_path  # noqa: E402

TARGET = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    replay_arguments(parser)
    parser.add_argument("--shape-a", default="256x4096")
    parser.add_argument("--shape-b", default="2048x512")
    parser.add_argument("--budget", type=int, default=60, help="the earlier campaign's")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()

    table = load_table(args.problem, args.template, [args.shape_a, args.shape_b])
    at_a, at_b = (
        column(table, args.shape_a, args.objective),
        column(table, args.shape_b, args.objective),
    )
    spaces = spaces_of(table)
    load_before = os.getloadavg()
    best_a_key = max(at_a.ratio, key=lambda k: at_a.ratio[k] or 0.0)
    runs: list[dict[str, Any]] = []
    for seed in range(1, args.seeds + 1):
        earlier = Campaign(f"earlier-s{seed}", at_a)
        search(earlier, spaces, seed, per_generation=args.per_generation, budget=args.budget)
        warm, cold = Campaign(f"b-s{seed}", at_b), Campaign(f"b-s{seed}", at_b)
        options: dict[str, Any] = {"per_generation": args.per_generation, "stop_at": args.fraction}
        warm_count = search(warm, spaces, seed, earlier=earlier.settled, **options)
        cold_count = search(cold, spaces, seed, **options)
        runs.append(
            {
                "seed": seed,
                "earlier_best_ratio_at_a": max(c.speedup or 0.0 for c in earlier.settled),
                "earlier_found_the_best_at_a": any(
                    c.proposal.param_key == best_a_key for c in earlier.settled
                ),
                "warm_to_reach": warm_count,
                "cold_to_reach": cold_count,
                "warm_first_proposals": [c.proposal.param_key for c in warm.settled[:3]],
            }
        )
        print(f"seed {seed}: warm {warm_count}, cold {cold_count}", flush=True)

    def median(key: str) -> float | None:
        values = [r[key] for r in runs]
        return None if any(v is None for v in values) else statistics.median(values)

    warm_median, cold_median = median("warm_to_reach"), median("cold_to_reach")
    ratio = warm_median / cold_median if warm_median and cold_median else None
    # How much the two shapes agree: where A's best point stands at B.
    best_a_at_b = at_b.ratio[best_a_key]
    report: dict[str, Any] = {
        "problem": args.problem,
        "shape_a": args.shape_a,
        "shape_b": args.shape_b,
        **table_facts(
            table, table_path(args.problem, args.template), ROOT, args.objective, load_before
        ),
        "space": len(at_b.ratio),
        "earlier_budget": args.budget,
        "per_generation": args.per_generation,
        "fraction": args.fraction,
        "best_at_a": at_a.params[best_a_key],
        "best_at_a_reaches_at_b": None if best_a_at_b is None else best_a_at_b / at_b.best,
        "runs": runs,
        "warm_median_to_reach": warm_median,
        "cold_median_to_reach": cold_median,
        "warm_over_cold": ratio,
        "target_ratio": TARGET,
        "target_met": ratio is not None and ratio <= TARGET,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"self_improvement_{args.objective}.json").write_text(
        json.dumps(report, indent=2) + "\n"
    )

    print(
        f"\nself-improvement: {', '.join(table['templates'])} ({args.problem}) on {table['host']}, "
        f"an earlier campaign at {args.shape_a} (budget {args.budget}), then {args.shape_b} "
        f"warm vs cold; replayed against the space measured once ({report['table']}; load "
        f"average while measuring {table['load_average_before'][0]:.1f} -> "
        f"{table['load_average_after'][0]:.1f})"
    )
    print(
        f"the best point at {args.shape_a} reaches "
        + (
            "-"
            if report["best_at_a_reaches_at_b"] is None
            else f"{report['best_at_a_reaches_at_b']:.0%}"
        )
        + f" of the best at {args.shape_b}"
    )
    print(f"{'seed':>4} {'warm: to 95%':>13} {'cold: to 95%':>13}")
    for r in runs:
        print(f"{r['seed']:>4} {r['warm_to_reach'] or '-':>13} {r['cold_to_reach'] or '-':>13}")
    print(
        f"median evaluations to 95% of the best at {args.shape_b}: warm {warm_median}, "
        f"cold {cold_median}" + ("" if ratio is None else f"; warm/cold {ratio:.2f}")
    )
    print(f"target: warm <= {TARGET}x cold: {'met' if report['target_met'] else 'MISSED'}")


if __name__ == "__main__":
    main()
