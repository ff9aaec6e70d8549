"""Candidates evaluated per minute, every check on, as a campaign's workers evaluate them.

Usage (the tree measured is the one on PYTHONPATH; run it for each tree in one session):
  PYTHONPATH=/path/to/main .venv/bin/python bench/eval_rate.py --label before
  PYTHONPATH=$PWD .venv/bin/python bench/eval_rate.py --label after

Evaluates `--candidates` kernels in one process with the actors' own back end
(`actors.devices.cpu_backend`, long-lived as a worker's is): each is verified
(`gpu_workers.verifier.verify`, a fresh secret seed) and then compiled and timed at the
shape against the first one as the incumbent (`actors.devices.compile_and_time`, with the
re-check after timing). The kernels are the problem's example, each made distinct by a
comment so that every one is compiled afresh, as a campaign's are. The host's calibration
is read (or measured) once before the clock starts, as a worker's setup does. Prints the
rate; adds it to bench/results/eval_rate.json under --label.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import kernels
from actors.devices import calibration_for, compile_and_time, cpu_backend
from gpu_workers.results import BenchmarkResult
from gpu_workers.verifier import verify
from kernels.loading import load_problem

RESULTS = Path(__file__).resolve().parent / "results"
FLAGS = ("-O3", "-march=native", "-fopenmp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="softmax")
    parser.add_argument("--shape", default="rows=4096,cols=4096")
    parser.add_argument("--candidates", type=int, default=6)
    parser.add_argument("--label", default="now")
    args = parser.parse_args()
    problem = load_problem(args.problem)
    shape = {k: int(v) for k, v in (part.split("=") for part in args.shape.split(","))}
    tree = Path(kernels.__file__).resolve().parent.parent
    example = (tree / "kernels" / "examples" / f"{args.problem}.c").read_text()
    calibration = calibration_for("cpu")
    backend = cpu_backend()
    stamp = f"{os.getpid()}-{time.time_ns()}"
    incumbent: tuple[str, tuple[str, ...]] | None = None
    seconds: list[float] = []
    started = time.perf_counter()
    for i in range(args.candidates):
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
    rate = args.candidates / (total / 60)
    load = os.getloadavg()[0]
    print(
        f"{args.label}: {args.candidates} candidates in {total:.0f} s = {rate:.2f} per minute "
        f"(median {statistics.median(seconds):.1f} s each; load average {load:.1f})"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "eval_rate.json"
    kept = json.loads(out.read_text()) if out.is_file() else {}
    kept.setdefault(args.label, []).append(
        {
            "problem": args.problem,
            "shape": shape,
            "candidates": args.candidates,
            "seconds": total,
            "per_minute": rate,
            "each_seconds": seconds,
            "load_average": load,
            "tree": str(tree),
        }
    )
    out.write_text(json.dumps(kept, indent=2) + "\n")


if __name__ == "__main__":
    main()
