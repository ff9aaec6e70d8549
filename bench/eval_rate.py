"""Candidates evaluated per minute, every check on, as a campaign's workers evaluate them.

Usage (the tree measured is the one on PYTHONPATH; run it for each tree in one session):
  PYTHONPATH=/path/to/main .venv/bin/python bench/eval_rate.py --label before
  PYTHONPATH=$PWD .venv/bin/python bench/eval_rate.py --label after
  PYTHONPATH=$PWD .venv/bin/python bench/eval_rate.py --swarm --label after
  PYTHONPATH=$PWD .venv/bin/python bench/eval_rate.py --swarm --tree /path/to/old --label old

With --swarm it runs a real campaign instead (`kfactory run` of the tree, embedded hub,
one verifier and the tree's default benchmarkers (--benchmarkers N: N of them), the
template writer, `--candidates` in one generation, timed at --shape) in a fresh run
folder and a fresh build cache (holding only a copy of this host's calibration, so no
run compiles less than another or measures the host), and reads the rate from the
recorded events: candidates settled (timed or rejected) over the time from the first
kernel written to the last settled.
With --tree it runs that tree's `kfactory run` instead of the one on PYTHONPATH (this
script's own code reads the result, so an older tree without this script can be measured
alike). It also reports, where the tree records them, the timing runs per candidate and the
host contention each result saw.

Evaluates `--candidates` kernels in one process with the actors' own back end
(`gpu_workers.targets.cpu_backend`, long-lived as a worker's is): each is verified
(`gpu_workers.verification.verify`, a fresh secret seed) and then compiled and timed at the
shape against the first one as the incumbent (`gpu_workers.targets.compile_and_time`, with the
re-check after timing). The kernels are the problem's example, each made distinct by a
comment so that every one is compiled afresh, as a campaign's are. The host's calibration
is read (or measured) once before the clock starts, as a worker's setup does. Prints the
rate; adds it to bench/results/eval_rate.json under --label.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

import kernels

RESULTS = Path(__file__).resolve().parent / "results"
FLAGS = ("-O3", "-march=native", "-fopenmp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="softmax")
    parser.add_argument("--shape", default="rows=4096,cols=4096")
    parser.add_argument("--candidates", type=int, default=6)
    parser.add_argument("--label", default="now")
    parser.add_argument("--swarm", action="store_true", help="run a campaign (see above)")
    parser.add_argument("--tree", type=Path, help="with --swarm: the tree whose campaign runs")
    parser.add_argument(
        "--benchmarkers",
        type=int,
        help="with --swarm: benchmarker actors the campaign runs (default: the tree's own)",
    )
    args = parser.parse_args()
    shape = {k: int(v) for k, v in (part.split("=") for part in args.shape.split(","))}
    if args.swarm:
        tree = (args.tree or Path(kernels.__file__).resolve().parent.parent).resolve()
        found = swarm_rate(
            args.problem, shape, args.candidates, args.label, tree, args.benchmarkers
        )
        _keep(args.label, found)
        return
    in_process(args.problem, shape, args.candidates, args.label)


def in_process(problem_name: str, shape: dict[str, int], candidates: int, label: str) -> None:
    """The candidates verified and timed one after another in this process."""
    from gpu_workers.results import BenchmarkResult
    from gpu_workers.targets import calibration_for, compile_and_time, cpu_backend
    from gpu_workers.verification import verify
    from kernels.loading import load_problem

    problem = load_problem(problem_name)
    tree = Path(kernels.__file__).resolve().parent.parent
    example = (tree / "kernels" / "examples" / f"{problem_name}.c").read_text()
    calibration = calibration_for("cpu")
    backend = cpu_backend()
    stamp = f"{os.getpid()}-{time.time_ns()}"
    incumbent: tuple[str, tuple[str, ...]] | None = None
    seconds: list[float] = []
    started = time.perf_counter()
    for i in range(candidates):
        source = example + f"\n// candidate {stamp}-{i}\n"
        began = time.perf_counter()
        verdict = verify(problem, backend, source, FLAGS)
        if not verdict.verified:
            raise SystemExit(f"candidate {i} was rejected: {verdict.rejection}")
        result = compile_and_time(
            "cpu",
            problem,
            source,
            FLAGS,
            "fp32",
            incumbent=incumbent,
            calibration=calibration,
            shape=shape,
        )
        if not isinstance(result, BenchmarkResult):
            raise SystemExit(f"candidate {i} was rejected while timed: {result}")
        seconds.append(time.perf_counter() - began)
        incumbent = incumbent or (source, FLAGS)
        print(
            f"  candidate {i}: {seconds[-1]:.1f} s, {result.kernel.median_ns / 1e6:.2f} ms, "
            f"{result.timing_attempts} timing run(s), contention "
            f"{result.host_contention_cores or 0:.2f} cores",
            file=sys.stderr,
        )
    total = time.perf_counter() - started
    rate = candidates / (total / 60)
    load = os.getloadavg()[0]
    print(
        f"{label}: {candidates} candidates in {total:.0f} s = {rate:.2f} per minute "
        f"(median {statistics.median(seconds):.1f} s each; load average {load:.1f})"
    )
    _keep(
        label,
        {
            "problem": problem_name,
            "shape": shape,
            "candidates": candidates,
            "seconds": total,
            "per_minute": rate,
            "each_seconds": seconds,
            "load_average": load,
            "tree": str(tree),
        },
    )


def _keep(label: str, measured: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "eval_rate.json"
    kept = json.loads(out.read_text()) if out.is_file() else {}
    kept.setdefault(label, []).append(measured)
    out.write_text(json.dumps(kept, indent=2) + "\n")


CAMPAIGN = """
name = "{name}"
problem = "{problem}"
target = "cpu"
shapes = [[{dims}]]
[budget]
candidates = {candidates}
wall_time = "120m"
stop_at_roofline = 1.5
[search]
per_generation = {candidates}
seed = 1
"""


def swarm_rate(
    problem: str,
    shape: dict[str, int],
    candidates: int,
    label: str,
    tree: Path,
    benchmarkers: int | None = None,
) -> dict[str, Any]:
    """One campaign of `candidates` run by `tree` (with `benchmarkers` if given, else the
    tree's default); its settling rate."""
    from gpu_workers.cpu.calibrate import calibration_path

    calibration = calibration_path()
    if not calibration.is_file():
        raise SystemExit(f"no calibration of this host in {calibration}: run `kfactory check`")
    with tempfile.TemporaryDirectory(prefix="eval-rate-") as scratch:
        work = Path(scratch)
        cache = work / "cache"
        cache.mkdir()
        shutil.copy(calibration, cache / calibration.name)
        name = f"eval-rate-{label}-{os.getpid()}"
        campaign = work / "campaign.toml"
        campaign.write_text(
            CAMPAIGN.format(
                name=name,
                problem=problem,
                dims=", ".join(str(v) for v in shape.values()),
                candidates=candidates,
            )
        )
        env = {**os.environ, "KFACTORY_CACHE_DIR": str(cache), "PYTHONPATH": str(tree)}
        load_before = os.getloadavg()
        began = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "ops.cli",
                "run",
                str(campaign),
                "--home",
                str(work / "home"),
                "--json",
                *(["--benchmarkers", str(benchmarkers)] if benchmarkers else []),
            ],
            env=env,
            cwd=tree,  # `-m` puts the working directory first on the path: the tree's
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - began
        load_after = os.getloadavg()
        if done.returncode != 0:
            raise SystemExit(f"the campaign failed ({done.returncode}): {done.stderr[-2000:]}")
        found = settling(work / "home" / "events.duckdb", name)
    span, rate = found["last_settled_s"], found["per_minute"]
    print(
        f"{label}: {found['settled']} candidates settled in {span:.0f} s of campaign "
        f"= {rate:.2f} per minute ({found['timed']} timed, {found['rejected']} rejected; "
        f"whole run {wall:.0f} s; load average {load_before[0]:.1f} -> {load_after[0]:.1f}; "
        f"timing runs {found['timing_attempts']}; contention {found['contention_cores']})"
    )
    return {
        "mode": "swarm",
        "problem": problem,
        "shape": shape,
        "candidates": candidates,
        "wall_seconds": wall,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "tree": str(tree),
        "benchmarkers": benchmarkers,
        **found,
    }


def settling(store: Path, campaign: str) -> dict[str, Any]:
    """From the recorded campaign: when kernels were first written and each candidate
    settled, the candidates settled per minute over that span, and what each timing saw."""
    db = duckdb.connect(str(store), read_only=True)
    try:
        (first,) = db.execute(
            "SELECT min(ts) FROM events WHERE campaign_id = ? AND type = 'KernelWritten'",
            [campaign],
        ).fetchone() or (None,)
        rows = db.execute(
            "SELECT type, epoch(ts - ?::TIMESTAMPTZ), "
            # schema 2 holds them as fields, schema 1 in `evidence`
            "coalesce(payload->>'timing_attempts', payload->'evidence'->>'timing_attempts'), "
            "coalesce(payload->>'host_contention_cores', "
            "payload->'evidence'->>'host_contention_cores') FROM events "
            "WHERE campaign_id = ? AND type IN ('BenchmarkCompleted', 'KernelRejected') "
            "ORDER BY ts",
            [first, campaign],
        ).fetchall()
    finally:
        db.close()
    timed = [r for r in rows if r[0] == "BenchmarkCompleted"]
    span = float(rows[-1][1]) if rows else 0.0
    return {
        "settled": len(rows),
        "timed": len(timed),
        "rejected": len(rows) - len(timed),
        "settled_at_s": [round(float(r[1]), 1) for r in rows],
        "last_settled_s": span,
        "per_minute": len(rows) / (span / 60) if span > 0 else 0.0,
        "timing_attempts": [int(r[2]) if r[2] is not None else None for r in timed],
        "contention_cores": [round(float(r[3]), 2) if r[3] is not None else None for r in timed],
    }


if __name__ == "__main__":
    main()
