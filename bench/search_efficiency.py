"""Search efficiency: how many evaluations the planner's search needs to reach 95% of the
exhaustive best of a design space, as a fraction of the space.

Usage:
  .venv/bin/python bench/space_table.py --template softmax_rows    # measure once
  .venv/bin/python bench/search_efficiency.py                           # replay, 10 seeds
  .venv/bin/python bench/search_efficiency.py --template softmax_rows --shape 256x4096

The space was measured exhaustively once on this host (`bench/space_table.py`: every
valid point compiled, checked and timed; the table is cached under bench/results/). The
planner's `TemplateSearch` is then replayed against that table (`bench/search_replay.py`),
generation by generation (8 per generation, as a campaign proposes them), with no earlier
campaign in its history (a cold start), for each seed: the count is the evaluations until
one point reaches 95% of the table's best. Uniform random sampling without replacement
is shown beside it. Nothing is timed in this script: the figures are the search's, on
real timings taken once, and the output says so.

Prints a table; writes bench/results/search_efficiency_<objective>.json (`--objective`:
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

from search_replay import (  # noqa: E402
    Campaign,
    column,
    random_search,
    replay_arguments,
    search,
    spaces_of,
    table_facts,
)
from space_table import RESULTS, load_table, table_path  # noqa: E402

TARGET = 0.12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    replay_arguments(parser)
    parser.add_argument("--shape", default="2048x512")
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()

    table = load_table(args.problem, args.template, [args.shape])
    measured = column(table, args.shape, args.objective)
    spaces = spaces_of(table)
    total = len(measured.ratio)
    goal = args.fraction * measured.best
    near = sum(1 for r in measured.ratio.values() if r is not None and r >= goal)
    rejected = sum(1 for r in measured.ratio.values() if r is None)
    load_before = os.getloadavg()

    planner: list[int | None] = []
    for seed in range(1, args.seeds + 1):
        campaign = Campaign(f"cold-s{seed}", measured)
        planner.append(
            search(
                campaign, spaces, seed, per_generation=args.per_generation, stop_at=args.fraction
            )
        )
        print(f"seed {seed}: planner reached {args.fraction:.0%} after {planner[-1]}", flush=True)
    randoms = [random_search(measured, args.fraction, seed) for seed in range(1, args.seeds + 1)]

    def median(counts: list[int | None]) -> float | None:
        if any(c is None for c in counts):
            return None
        return statistics.median(c for c in counts if c is not None)

    planner_median, random_median = median(planner), median(list(randoms))
    best_key = max(measured.ratio, key=lambda k: measured.ratio[k] or 0.0)
    report: dict[str, Any] = {
        "problem": args.problem,
        "shape": args.shape,
        **table_facts(
            table, table_path(args.problem, args.template), ROOT, args.objective, load_before
        ),
        "exhaustive": total,
        "rejected": rejected,
        "best_ratio": measured.best,
        "best_point": measured.params[best_key],
        "goal_ratio": goal,
        "points_at_goal": near,
        "per_generation": args.per_generation,
        "seeds": args.seeds,
        "planner_evaluations": planner,
        "planner_median": planner_median,
        "planner_median_fraction": None if planner_median is None else planner_median / total,
        "random_evaluations": randoms,
        "random_median": random_median,
        "random_median_fraction": None if random_median is None else random_median / total,
        "random_expected_fraction": (total + 1) / (near + 1) / total,
        "target_fraction": TARGET,
    }
    report["target_met"] = (
        report["planner_median_fraction"] is not None
        and report["planner_median_fraction"] <= TARGET
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"search_efficiency_{args.objective}.json").write_text(
        json.dumps(report, indent=2) + "\n"
    )

    print(
        f"\nsearch efficiency: {', '.join(table['templates'])} ({args.problem}) at {args.shape} "
        f"on {table['host']}, replayed against the space measured once "
        f"({report['table']}; load average while measuring "
        f"{table['load_average_before'][0]:.1f} -> {table['load_average_after'][0]:.1f})"
    )
    print(
        f"exhaustive: {total} points ({rejected} rejected); objective {args.objective}, best "
        f"{measured.best:.2f}; goal {args.fraction:.0%} of it, met by {near} points "
        f"({near / total:.1%})"
    )
    print(f"{'search':<8} {'evaluations per seed':<44} {'median':>7} {'of the space':>13}")
    for name, counts, med in (
        ("planner", planner, planner_median),
        ("random", list(randoms), random_median),
    ):
        shown = ", ".join("-" if c is None else str(c) for c in counts)
        print(
            f"{name:<8} {shown:<44} {'-' if med is None else f'{med:g}':>7} "
            f"{'-' if med is None else f'{med / total:.1%}':>13}"
        )
    print(f"random, expected: {report['random_expected_fraction']:.1%} of the space")
    print(
        f"target: planner median <= {TARGET:.0%} of the space, over {args.seeds} seeds: "
        f"{'met' if report['target_met'] else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
