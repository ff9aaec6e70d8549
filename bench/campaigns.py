"""Campaign figures: one real campaign per built-in CPU problem, checked against the
targets of issue #4.

Usage:
  .venv/bin/python bench/campaigns.py                          # budget 200 each (slow)
  .venv/bin/python bench/campaigns.py --budget 24
  .venv/bin/python bench/campaigns.py --problems softmax,kda --budget 40 --per-generation 8

Each campaign is written as a campaign file and run by the real command,
`kfactory run FILE --home H --json`, in a subprocess with a fresh temporary home (its
own nats-server, recorder and six actors), so nothing is shared between problems. The
figures come from the command's JSON: the best kernel's median time, its speedup over
the numpy baseline timed in the same run (so the baseline time is median x speedup),
and its fraction of this host's calibrated roofline. Prints a table and the targets;
writes bench/results/campaigns.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
KFACTORY = ROOT / ".venv" / "bin" / "kfactory"

# problem -> the shape timed (None: the problem's default shape)
PROBLEMS: dict[str, list[int] | None] = {
    "softmax": [4096, 4096],
    "rmsnorm": None,
    "layernorm": None,
    "gelu": None,
    "residual_rmsnorm_gelu": None,
    "matmul": [1024, 1024, 1024],
    "kda": None,
}


def _speedup(row: dict[str, Any]) -> float:
    return float(row["speedup"] or 0.0)


def _roofline(row: dict[str, Any]) -> float:
    return float(row["roofline_fraction"] or 0.0)


# problem -> (what the issue asks, is it met)
TARGETS: dict[str, tuple[str, Callable[[dict[str, Any]], bool]]] = {
    "softmax": ("<= 4.7 ms", lambda r: r["best_ms"] is not None and r["best_ms"] <= 4.7),
    "rmsnorm": (
        ">= 80% roofline and >= 10x numpy",
        lambda r: _roofline(r) >= 0.8 and _speedup(r) >= 10,
    ),
    "layernorm": (
        ">= 80% roofline and >= 10x numpy",
        lambda r: _roofline(r) >= 0.8 and _speedup(r) >= 10,
    ),
    "residual_rmsnorm_gelu": (">= 8x unfused numpy", lambda r: _speedup(r) >= 8),
    "matmul": (">= 50% of numpy GFLOP/s", lambda r: _speedup(r) >= 0.5),
    "kda": (">= 20x numpy", lambda r: _speedup(r) >= 20),
}


def _default_shape(problem: str) -> list[int]:
    sys.path.insert(0, str(ROOT))
    from kernels.loading import load_problem

    return list(load_problem(problem).default_shape.values())


def campaign_text(
    name: str, problem: str, shape: list[int], budget: int, per_generation: int, seed: int
) -> str:
    return (
        f'name    = "{name}"\n'
        f'problem = "{problem}"\n'
        'target  = "cpu"\n'
        f"shapes  = [{json.dumps(shape)}]\n\n"
        "[budget]\n"
        f"candidates = {budget}\n"
        'wall_time  = "4h"\n\n'
        "[search]\n"
        f"per_generation = {per_generation}\n"
        f"seed = {seed}\n"
    )


def run_campaign(
    problem: str, shape: list[int], budget: int, per_generation: int, seed: int, timeout: float
) -> dict[str, Any]:
    name = f"bench-{problem.replace('_', '-')}-b{budget}-s{seed}"
    with tempfile.TemporaryDirectory(prefix="kf-bench-") as tmp:
        file = Path(tmp) / "campaign.toml"
        file.write_text(campaign_text(name, problem, shape, budget, per_generation, seed))
        started = time.monotonic()
        proc = subprocess.run(
            [str(KFACTORY), "run", str(file), "--home", str(Path(tmp) / "home"), "--json"],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )
        wall = time.monotonic() - started
    row: dict[str, Any] = {
        "problem": problem,
        "shape": shape,
        "campaign_id": name,
        "wall_s": wall,
        "exit": proc.returncode,
    }
    if proc.returncode != 0:
        return row | {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    best = out.get("best") or {}
    median_ns = best.get("median_ns")
    speedup = best.get("speedup")
    return row | {
        "best_ms": median_ns / 1e6 if median_ns else None,
        "baseline_ms": median_ns * speedup / 1e6 if median_ns and speedup else None,
        "speedup": speedup,
        "roofline_fraction": best.get("roofline_fraction"),
        "evaluated": out.get("evaluated"),
        "duplicates_avoided": out.get("duplicates_avoided"),
        "rejected_by_stage": out.get("rejected_by_stage") or {},
        "generations": out.get("generations"),
        "finished": out.get("finished"),
        "source_hash": best.get("source_hash"),
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'problem':<22} {'shape':<16} {'best ms':>9} {'base ms':>9} {'speedup':>8} "
        f"{'roofline':>8} {'eval':>5} {'dups':>5} {'rejected by stage':<22} {'wall s':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        shape = "x".join(str(v) for v in r["shape"])
        if "error" in r:
            print(f"{r['problem']:<22} {shape:<16} failed (exit {r['exit']}): {r['error']}")
            continue
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(r["rejected_by_stage"].items())) or "-"
        print(
            f"{r['problem']:<22} {shape:<16} {_fmt(r['best_ms'], '.3f'):>9} "
            f"{_fmt(r['baseline_ms'], '.3f'):>9} {_fmt(r['speedup'], '.2f'):>7}x "
            f"{_fmt(r['roofline_fraction'] and r['roofline_fraction'] * 100, '.0f'):>7}% "
            f"{r['evaluated']:>5} {r['duplicates_avoided']:>5} {rejected:<22} {r['wall_s']:>7.0f}"
        )
    print("\ntargets (issue #4):")
    for r in rows:
        if r["problem"] not in TARGETS:
            continue
        text, check = TARGETS[r["problem"]]
        met = "error" if "error" in r else ("met" if check(r) else "MISSED")
        print(f"  {r['problem']:<22} {text:<34} {met}")
    for r in rows:
        if r.get("finished"):
            print(f"  ({r['problem']} finished: {r['finished']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=200, help="candidates per campaign")
    parser.add_argument("--problems", default=",".join(PROBLEMS), help="comma-separated subset")
    parser.add_argument("--per-generation", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per campaign")
    args = parser.parse_args()

    chosen = [p.strip() for p in args.problems.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in PROBLEMS]
    if unknown:
        raise SystemExit(f"unknown problems: {', '.join(unknown)}; known: {', '.join(PROBLEMS)}")
    rows: list[dict[str, Any]] = []
    for problem in chosen:
        shape = PROBLEMS[problem] or _default_shape(problem)
        print(
            f"running {problem} at {'x'.join(map(str, shape))}, budget {args.budget} ...",
            file=sys.stderr,
            flush=True,
        )
        rows.append(
            run_campaign(problem, shape, args.budget, args.per_generation, args.seed, args.timeout)
        )
    for r in rows:
        if r["problem"] in TARGETS and "error" not in r:
            r["target"] = TARGETS[r["problem"]][0]
            r["target_met"] = TARGETS[r["problem"]][1](r)
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {"budget": args.budget, "per_generation": args.per_generation, "campaigns": rows}
    (RESULTS / "campaigns.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\ncampaigns: budget {args.budget} candidates each, {args.per_generation} per generation"
    )
    print_table(rows)


if __name__ == "__main__":
    main()
