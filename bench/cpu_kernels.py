"""CPU kernel figures: `kfactory check --bench` on the example kernels, and repeatability;
or, with --fractions, the fraction of the calibrated bandwidth the row templates reach.

Usage:
  .venv/bin/python bench/cpu_kernels.py                      # softmax, rmsnorm, matmul
  .venv/bin/python bench/cpu_kernels.py --problems softmax --repeats 5
  .venv/bin/python bench/cpu_kernels.py --fractions --budget 40 --rounds 20

--fractions: for rmsnorm, layernorm and residual_rmsnorm_gelu at 4096x4096, a TPE search
over the problem's row template (bench/native_harness.py: the planner's sampler, each
point compiled and timed in process), the best point verified by the factory's verifier,
then one interleaved run of that point, the example kernel and numpy (medians over
rounds). Writes bench/results/cpu_fractions.json with the load average.

Prints a table and writes bench/results/cpu_kernels.json. Every figure is measured here,
on this host, by the same code paths the factory uses. The CPU that other processes used
during each run is recorded (`busy`, in cores), because other work on the host skews timing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from native_harness import (
    BUILD_DIR,
    Workload,
    compile_library,
    copy_call,
    interleaved,
    load_average,
    native_call,
    search_template,
    summary,
    timed,
)

from gpu_workers.benchmarker import benchmark
from gpu_workers.cache_root import cache_root
from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.cpu.calibrate import load_or_calibrate
from gpu_workers.cpu.compiler import default_cache_dir
from gpu_workers.results import BenchmarkResult
from gpu_workers.verifier import verify
from kernels.builtin import BUILTIN
from kernels.templates import EXAMPLE_TEMPLATES, TEMPLATES
from ops.check_cmd import _flags

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "kernels" / "examples"
RESULTS = ROOT / "bench" / "results"
KFACTORY = Path(sys.executable).parent / "kfactory"


def check_bench(problem: str) -> dict[str, Any]:
    source = EXAMPLES / f"{problem}.c"
    command = [
        str(KFACTORY),
        "check",
        problem,
        "--target",
        "cpu",
        "--source",
        str(source.relative_to(ROOT)),
        "--bench",
        "--json",
    ]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed: {proc.stderr}")
    report = json.loads(proc.stdout)
    report["command"] = " ".join(["kfactory", *command[1:]])
    return report


def repeatability(problem: str, repeats: int) -> dict[str, Any]:
    spec = BUILTIN[problem]
    backend = CpuBackend(cache_dir=default_cache_dir())
    text = (EXAMPLES / f"{problem}.c").read_text()
    compiled = backend.compile(spec, text, _flags(text, None))
    assert compiled.build is not None, compiled.rejection
    calibration = load_or_calibrate(cache_root())
    medians, minimums, busy = [], [], []
    for _ in range(repeats):
        result = benchmark(
            spec,
            backend,
            compiled.build,
            calibration,
            recalibrate=lambda: load_or_calibrate(cache_root(), force=True),
        )
        if not isinstance(result, BenchmarkResult):
            raise SystemExit(f"repeatability run rejected: {result}")
        medians.append(result.kernel.median_ns)
        minimums.append(result.kernel.min_ns)
        busy.append(result.host_contention_cores)
    spread = (max(medians) - min(medians)) / min(medians)
    min_spread = (max(minimums) - min(minimums)) / min(minimums)
    return {
        "problem": problem,
        "shape": spec.default_shape,
        "medians_ns": medians,
        "worst_spread": spread,
        "minimums_ns": minimums,
        "worst_spread_of_minimums": min_spread,
        "host_contention_cores": busy,
    }


FRACTION_PROBLEMS = ("rmsnorm", "layernorm", "residual_rmsnorm_gelu")


def searched_fraction(
    problem: str, budget: int, rounds: int, bandwidth_gbs: float
) -> dict[str, Any]:
    spec = BUILTIN[problem]
    template = TEMPLATES[EXAMPLE_TEMPLATES[problem]]
    workload = Workload(spec, dict(spec.default_shape))
    found = search_template(template, workload, budget, seed=1)
    rendered = template.render(found.best)
    verdict = verify(
        spec, CpuBackend(cache_dir=BUILD_DIR / "verify"), rendered.source, rendered.flags
    )
    if not verdict.verified:
        raise SystemExit(f"{problem}: the best point failed verification: {verdict.rejection}")
    example = template.render(template.best_known)
    contenders = {
        "searched_best": native_call(
            compile_library(f"{problem}-best", rendered.source, rendered.flags), workload
        ),
        "example": native_call(
            compile_library(f"{problem}-example", example.source, example.flags), workload
        ),
        "numpy": timed(lambda i: spec.baseline(workload.inputs[i])),
    }
    copy = copy_call(workload, "x", "y")
    errors = {}
    for name, call in contenders.items():
        call(0)
        errors[name] = workload.max_rel_error(0) if name != "numpy" else 0.0
    contenders["copy_x_to_y"] = copy
    errors["copy_x_to_y"] = float("nan")
    table = summary(interleaved(contenders, rounds, workload.sets), "numpy")
    # the copy moves x and y only: the problem's bytes at the copy's rate
    copy_gbs = 2 * workload.inputs[0]["x"].nbytes / (table["copy_x_to_y"]["median_ms"] / 1e3)
    for name, row in table.items():
        moved = 2 * workload.inputs[0]["x"].nbytes if name == "copy_x_to_y" else workload.nbytes
        gbs = moved / (row["median_ms"] / 1e3)
        row["bandwidth_fraction"] = gbs / (bandwidth_gbs * 1e9)
        row["fraction_of_copy_in_this_run"] = gbs / copy_gbs
        row["max_rel_error"] = errors[name]
    return {
        "problem": problem,
        "template": template.name,
        "shape": spec.default_shape,
        "bytes_moved": workload.nbytes,
        "search": {
            "budget": budget,
            "seconds": found.seconds,
            "best": found.best,
            "best_ms_in_search": found.best_ms,
            "evaluated": found.evaluated,
        },
        "verified_max_rel_err": verdict.max_rel_err,
        "interleaved": table,
        "load_average": load_average(),
    }


def fractions(budget: int, rounds: int) -> None:
    started = time.time()
    loads = [load_average()]
    calibration = load_or_calibrate(cache_root())
    print(
        f"host {calibration.cpu_model}, {calibration.cores} cores; calibrated copy bandwidth "
        f"{calibration.memory_bandwidth_gbs:.1f} GB/s; load average {loads[0]}"
    )
    found = []
    for problem in FRACTION_PROBLEMS:
        result = searched_fraction(problem, budget, rounds, calibration.memory_bandwidth_gbs)
        found.append(result)
        print(f"\n{problem} ({result['template']}): best {result['search']['best']}")
        print(
            f"  {'kernel':14s} {'median ms':>10s} {'IQR ms':>14s} {'of bandwidth':>13s} "
            f"{'of copy now':>12s}"
        )
        for name, row in result["interleaved"].items():
            print(
                f"  {name:14s} {row['median_ms']:10.2f} {row['q1_ms']:6.2f}-{row['q3_ms']:<7.2f} "
                f"{row['bandwidth_fraction']:12.1%} {row['fraction_of_copy_in_this_run']:11.1%}"
            )
        print(f"  load average {result['load_average']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "cpu_fractions.json"
    out.write_text(
        json.dumps(
            {
                "calibrated_bandwidth_gbs": calibration.memory_bandwidth_gbs,
                "cpu_model": calibration.cpu_model,
                "results": found,
                "load_average_start": loads[0],
                "seconds": time.time() - started,
            },
            indent=2,
        )
    )
    print(f"\nwrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="softmax,rmsnorm,matmul")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--repeat-problems", default="softmax,rmsnorm,matmul")
    parser.add_argument("--recalibrate", action="store_true", help="measure the host again")
    parser.add_argument("--fractions", action="store_true", help="bandwidth fractions only")
    parser.add_argument("--budget", type=int, default=40, help="points per search (--fractions)")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds (--fractions)")
    args = parser.parse_args()
    if args.fractions:
        fractions(args.budget, args.rounds)
        return
    started = time.time()
    calibration = load_or_calibrate(cache_root(), force=args.recalibrate)
    print(
        f"host {calibration.host}: {calibration.cpu_model}, {calibration.cores} cores, "
        f"LLC {calibration.llc_bytes >> 20} MiB; bandwidth {calibration.memory_bandwidth_gbs:.1f} "
        f"GB/s (numpy copy {calibration.numpy_copy_bandwidth_gbs:.1f}); fp32 peak "
        f"{calibration.peak_fp32_gflops:.0f} GFLOP/s (sgemm {calibration.sgemm_gflops:.0f}, "
        f"FMA {calibration.fma_peak_gflops:.0f}); other load while calibrating "
        f"{calibration.host_contention_cores or 0:.2f} cores"
    )
    checks = [check_bench(p) for p in args.problems.split(",") if p]
    print(
        f"\n{'problem':10s} {'verdict':9s} {'median ms':>10s} {'IQR ms':>8s} {'numpy ms':>9s} "
        f"{'speedup':>8s} {'roofline':>9s} {'busy':>5s}"
    )
    for r in checks:
        if r["verdict"] != "verified":
            print(f"{r['problem']:10s} rejected  {r['stage']}/{r['reason']}: {r['message']}")
            continue
        print(
            f"{r['problem']:10s} {r['verdict']:9s} {r['median_ns'] / 1e6:10.3f} "
            f"{r['iqr_ns'] / 1e6:8.3f} {r['baseline_ns'] / 1e6:9.3f} {r['speedup']:7.2f}x "
            f"{r['roofline_fraction']:9.3f} {r['host_contention_cores']:5.2f}"
        )
    repeats = [repeatability(p, args.repeats) for p in args.repeat_problems.split(",") if p]
    print(f"\nrepeatability: {args.repeats} benchmark runs of the same kernel, fresh process each")
    for r in repeats:
        medians = ", ".join(f"{m / 1e6:.3f}" for m in r["medians_ns"])
        busy = ", ".join(f"{b:.2f}" for b in r["host_contention_cores"])
        print(f"  {r['problem']:10s} medians ms [{medians}]  worst spread {r['worst_spread']:.1%}")
        print(f"  {'':10s} other load (cores) [{busy}]")
        print(f"  {'':10s} spread of the fastest call per run {r['worst_spread_of_minimums']:.1%}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "cpu_kernels.json"
    out.write_text(
        json.dumps(
            {
                "calibration": msgspec.to_builtins(calibration),
                "checks": checks,
                "repeatability": repeats,
                "seconds": time.time() - started,
            },
            indent=2,
        )
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
