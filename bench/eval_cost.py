"""Where one evaluation's time goes: verify, then time, one kernel as a campaign does.

Usage (the tree measured is the one on PYTHONPATH; --label names the measurement):
  PYTHONPATH=$PWD .venv/bin/python bench/eval_cost.py --label after [--problem softmax]
      [--shape rows=4096,cols=4096] [--repeats 2]

Each repeat evaluates `kernels/examples/PROBLEM.c` the way the verifier and benchmarker
actors do (`gpu_workers.verification.verify`, then `gpu_workers.benchmarking.benchmark` at the
shape), with a cold compile cache, and splits the wall time into phases:

- compile + static (cold cache), and the benchmarker's compile (cache hit);
- input generation for the verification trials (`plan_trials`);
- one driver start: the interpreter, the sandbox, and the driver's imports (measured on
  its own, `python -m gpu_workers.sandbox ... gpu_workers.cpu.runner` on a job that does
  nothing but import the timing module);
- the verification run in the driver less that start (kernel host start, the trials'
  calls, the arrays written and read back);
- the float64 references of the verification trials, and the comparisons;
- the timing run, split by the driver's progress marks (run in this process, with the
  driver's own code: baseline inputs, kernel host start and fresh inputs, warm-up,
  timing, judging the timed calls and the re-check of every distribution at the shape).

With --warm-pool the worker's re-check pool is filled first (not counted): the re-check
then costs what it does once a campaign has drawn every set. This process runs in the
driver's environment (`gpu_workers.cpu.backend.DRIVER_ENV`): it keeps the memory it frees,
so later repeats pay less for fresh pages in their set-up than a driver does.

Prints a table; writes bench/results/eval_cost.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kernels
from gpu_workers import runner_files
from gpu_workers.benchmarking import BenchmarkRequest, benchmark
from gpu_workers.cpu import protocol as p
from gpu_workers.cpu import timing_run
from gpu_workers.cpu.backend import DRIVER_ENV, CpuBackend
from gpu_workers.sandbox import scrubbed_env
from gpu_workers.targets import calibration_for, cpu_backend
from gpu_workers.verification import judge_runs, new_seed, plan_trials, precheck
from kernels.loading import load_problem
from kernels.spec import Problem

RESULTS = Path(__file__).resolve().parent / "results"
FLAGS = ("-O3", "-march=native", "-fopenmp")


def _timed(action: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = action()
    return result, time.perf_counter() - started


def driver_start_seconds() -> float:
    """One driver process: interpreter, sandbox set-up and the driver's imports, as the
    back end starts it (scrubbed environment, this interpreter)."""
    with tempfile.TemporaryDirectory() as workdir:
        command = [
            sys.executable,
            "-c",
            "import gpu_workers.sandbox, gpu_workers.cpu.runner, gpu_workers.cpu.timing_run, "
            "gpu_workers.cpu.verify_run",
        ]
        env = scrubbed_env(Path(workdir))
        started = time.perf_counter()
        subprocess.run(command, cwd=workdir, env=env, check=True)
        return time.perf_counter() - started


@contextmanager
def progress_marks() -> Iterator[list[tuple[str, float]]]:
    """Record the driver's progress marks with their times (the driver run in this process)."""
    marks: list[tuple[str, float]] = []
    original = runner_files.write_progress

    def mark(text: str) -> None:
        marks.append((text, time.perf_counter()))

    runner_files.write_progress = mark
    try:
        yield marks
    finally:
        runner_files.write_progress = original


def phase_of(mark: str) -> str:
    if mark.startswith("re-check after timing") and ", seed " in mark:
        return "timing: re-check, the kernel's calls and judging (bands or float64)"
    if mark.startswith("re-check after timing"):
        return "timing: re-check inputs (a pool set: filled on first use, else mapped)"
    return {
        "baseline inputs": "timing: baseline inputs",
        "starting the kernel": "timing: kernel host start, arenas, fresh inputs",
        "warm-up": "timing: warm-up",
        "timing": "timing: timed rounds (kernel + baseline interleaved)",
        "judging the timed calls": "timing: judge the timed calls",
    }.get(mark, f"timing: {mark}")


def timing_phases(
    problem: Problem,
    backend: CpuBackend,
    build: Any,
    incumbent: Any,
    shape: dict[str, int],
    llc: int,
) -> dict[str, float]:
    """The driver's timing run (its own code, in this process), split by its marks."""
    seed = new_seed()
    job = p.BenchJob(
        library=build.library,
        incumbent_library=incumbent.library if incumbent is not None else None,
        kernel_host=backend._kernel_host(backend.bench_limits),
        fresh_inputs_library=str(timing_run_fresh_library(backend)),
        problem=problem.load_spec,
        dtype="fp32",
        shape=shape,
        seed=seed,
        seeds=[seed + 1, seed + 2],
        recheck_seed=seed + 3,
        **pool_of(backend),
        **caches_of(backend, llc),
    )
    with tempfile.TemporaryDirectory() as workdir, progress_marks() as marks:
        cwd = os.getcwd()
        os.chdir(workdir)
        try:
            reply = timing_run.bench(job)
        finally:
            os.chdir(cwd)
    if reply.rejection is not None:
        raise SystemExit(f"the example was rejected while timed: {reply.rejection.message}")
    phases: dict[str, float] = {}
    for (text, at), (_, until) in itertools.pairwise(marks):
        name = phase_of(text)
        phases[name] = phases.get(name, 0.0) + until - at
    return phases


def pool_of(backend: CpuBackend) -> dict[str, Any]:
    """The worker's re-check pool, where this tree's back end keeps one."""
    pool = getattr(backend, "recheck_pool", None)
    return {"recheck_pool": str(pool.folder)} if pool is not None else {}


def caches_of(backend: CpuBackend, llc: int) -> dict[str, Any]:
    """The cache flush, where this tree's timing has one; else how much the inputs rotate
    over (twice the last-level cache)."""
    try:
        from gpu_workers.cpu.trusted_build import cache_flush_library
    except ImportError:
        return {"rotate_bytes": 2 * llc}
    return {"cache_flush_library": str(cache_flush_library(backend.cache_dir))}


def timing_run_fresh_library(backend: CpuBackend) -> Path:
    from gpu_workers.cpu.trusted_build import fresh_inputs_library

    return fresh_inputs_library(backend.cache_dir)


def fill_pool(problem: Problem, backend: CpuBackend, shape: dict[str, int]) -> float:
    """Every set of the worker's re-check pool at `shape`, as a long campaign has them
    after its first candidates; the seconds it took."""
    from gpu_workers.recheck_pool import SETS, entry

    if backend.recheck_pool is None:
        return 0.0
    started = time.perf_counter()
    full = problem.full_shape(shape)
    for distribution in problem.distributions:
        for draw in range(SETS):
            pooled = entry(backend.recheck_pool.folder, problem, full, "fp32", distribution, draw)
            if not pooled.ready:
                pooled.fill(problem, full, distribution, "fp32")
    return time.perf_counter() - started


def one_evaluation(
    problem: Problem,
    shape: dict[str, int],
    source: str,
    warm_pool: bool,
    incumbent_source: str | None,
) -> dict[str, float]:
    calibration = calibration_for("cpu")
    phases: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as cold:
        cold_backend = CpuBackend(cache_dir=Path(cold))
        compiled, phases["verify: compile + static (cold cache)"] = _timed(
            lambda: precheck(problem, cold_backend, source, FLAGS, "fp32")
        )
    backend = cpu_backend()  # the workers' own: long-lived, as in a campaign
    if warm_pool:
        phases["(not counted) filling every set of the re-check pool"] = fill_pool(
            problem, backend, shape
        )
    build = precheck(problem, backend, source, FLAGS, "fp32").build
    assert compiled.build is not None and build is not None
    seed = new_seed()
    trials, phases["verify: input generation (plan_trials)"] = _timed(
        lambda: plan_trials(problem, "fp32", seed)
    )
    outcome, run_seconds = _timed(lambda: backend.run_trials(problem, build, trials))
    start = statistics.median(driver_start_seconds() for _ in range(3))
    phases["verify: driver start (python, sandbox, imports)"] = start
    phases["verify: trials on the kernel host, arrays in and out"] = run_seconds - start
    _, references = _timed(lambda: [problem.expected(t.inputs) for t in trials])
    judgement, judging = _timed(
        lambda: judge_runs(problem, problem.tolerances["fp32"], trials, outcome.runs)
    )
    # a (rejection, reports, worst) tuple, or a record with `rejection` in newer trees
    rejection = judgement[0] if isinstance(judgement, tuple) else judgement.rejection
    if rejection is not None:
        raise SystemExit(f"the example was rejected: {rejection.message}")
    phases["verify: float64 references"] = references
    phases["verify: comparisons"] = max(0.0, judging - references)
    _, phases["bench: compile (cache hit)"] = _timed(
        lambda: backend.compile(problem, source, FLAGS, "fp32")
    )
    incumbent = None
    if incumbent_source is not None:
        incumbent = precheck(problem, backend, incumbent_source, FLAGS, "fp32").build
    result, bench_seconds = _timed(
        lambda: benchmark(
            BenchmarkRequest(problem, backend, build, calibration, incumbent=incumbent, shape=shape)
        )
    )
    if not hasattr(result, "kernel"):
        raise SystemExit(f"the example was rejected while timed: {result}")
    inside = timing_phases(problem, backend, build, incumbent, shape, calibration.llc_bytes)
    phases["bench: driver start (python, sandbox, imports)"] = start
    phases.update(inside)  # one timing run, split in this process with the driver's code
    phases["bench: repeated timing runs (busy host) and the rest"] = max(
        0.0, bench_seconds - start - sum(inside.values())
    )
    phases["bench: timing attempts"] = float(result.timing_attempts)
    phases["bench: baseline samples per run"] = float(result.baseline.runs)
    phases["bench: kernel samples per run"] = float(result.kernel.runs)
    phases["total (verify + bench)"] = (
        run_seconds
        + bench_seconds
        + sum(
            v
            for k, v in phases.items()
            if k.startswith(
                (
                    "verify: compile",
                    "verify: input",
                    "verify: float64",
                    "verify: comp",
                    "bench: compile",
                )
            )
        )
    )
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="softmax")
    parser.add_argument("--shape", default="rows=4096,cols=4096")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--label", default="now", help="name of this measurement in the JSON")
    parser.add_argument(
        "--warm-pool",
        action="store_true",
        help="fill the whole re-check pool first (a campaign past its first candidates)",
    )
    parser.add_argument(
        "--kernel", type=Path, help="the kernel's C source (default: the problem's example)"
    )
    parser.add_argument(
        "--incumbent",
        type=Path,
        help="time the kernel head-to-head against this C source, as a campaign does once "
        "it has a best (default: no incumbent)",
    )
    args = parser.parse_args()
    # The driver's code runs in this process, so it runs in the driver's environment, which
    # the C library reads at start-up (MALLOC_ARENA_MAX, GLIBC_TUNABLES): started again
    # with it if need be.
    if any(os.environ.get(name) != value for name, value in DRIVER_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **DRIVER_ENV})
    problem = load_problem(args.problem)
    shape = {k: int(v) for k, v in (part.split("=") for part in args.shape.split(","))}
    tree = Path(kernels.__file__).resolve().parent.parent  # the tree on PYTHONPATH
    example = tree / "kernels" / "examples" / f"{args.problem}.c"
    source = (args.kernel or example).read_text()
    incumbent = args.incumbent.read_text() if args.incumbent else None
    runs = []
    for i in range(args.repeats):
        runs.append(one_evaluation(problem, shape, source, args.warm_pool, incumbent))
        print(f"  repeat {i + 1}/{args.repeats} done", file=sys.stderr)
    names = list(runs[0])
    table = {name: statistics.median(r.get(name, 0.0) for r in runs) for name in names}
    total = table["total (verify + bench)"]
    print(f"{args.problem} {args.shape}: one evaluation, median of {args.repeats}")
    print(f"{'phase':<78} {'s':>7} {'share':>6}")
    for name in names:
        seconds = table[name]
        share = (
            ""
            if not name.startswith(("verify", "bench: d", "bench: c", "bench: r", "timing"))
            else f"{seconds / total:6.1%}"
        )
        print(f"{name:<78} {seconds:7.2f} {share:>6}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "eval_cost.json"
    previous = json.loads(out.read_text()) if out.is_file() else {}
    previous[args.label] = {"problem": args.problem, "shape": shape, "median": table, "runs": runs}
    out.write_text(json.dumps(previous, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
