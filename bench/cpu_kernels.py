"""CPU kernel figures: `kfactory check --bench` on the example kernels, and repeatability;
or, with --fractions, the fraction of the calibrated bandwidth the row templates reach.

Usage:
  .venv/bin/python bench/cpu_kernels.py                      # softmax, rmsnorm, matmul
  .venv/bin/python bench/cpu_kernels.py --problems softmax --repeats 5
  .venv/bin/python bench/cpu_kernels.py --fractions --budget 40 --rounds 20

--fractions: for rmsnorm, layernorm and residual_rmsnorm_gelu at 4096x4096, a TPE search
over the problem's row template (bench/native_harness.py: the planner's sampler, each
point compiled and timed in process); its 3 fastest points timed again interleaved, the
fastest of them verified by the factory's verifier; then one interleaved run of: that
point; the same point as main's space could say it (when a parameter added since moved);
the template's example (best_known, the "before"); numpy; the calibration's non-temporal
copy and the same copy with ordinary stores (write-allocate), x to y. Per kernel: median
and best ms, GB/s of the bytes the problem counts (read + written, as the calibration
counts its copy), their fraction of the calibrated bandwidth (median; best, as the
calibration takes its best of 15; median with the write-allocate reads of ordinary stores
added), and the median per-round fraction of the non-temporal copy and of the copy with
the kernel's own kind of store. For the chain, bench/roofline.py's bound from ceilings
measured in the same run. Then each timed point's arithmetic floor (one core, rows in L2,
least of 300 calls), and the fraction of the calibrated bandwidth that floor leaves
reachable. Writes bench/results/cpu_fractions.json with the load average.

Prints a table and writes bench/results/cpu_kernels.json. Every figure is measured here,
on this host, by the same code paths the factory uses. The CPU that other processes used
during each run is recorded (`busy`, in cores), because other work on the host skews timing.
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

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from native_harness import (
    BUILD_DIR,
    CALIBRATION_SOURCE,
    SearchResult,
    Workload,
    compile_library,
    interleaved,
    library_call,
    load_average,
    native_call,
    search_template,
    summary,
    timed,
)
from roofline import Ceilings, measure

from gpu_workers.benchmarking import BenchmarkRequest, benchmark
from gpu_workers.cache_root import cache_root
from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.cpu.calibrate import load_or_calibrate
from gpu_workers.cpu.toolchain import default_cache_dir
from gpu_workers.results import BenchmarkResult
from gpu_workers.verification import verify
from kernels.builtin import BUILTIN
from kernels.design_space import Template
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
            BenchmarkRequest(
                spec,
                backend,
                compiled.build,
                calibration,
                recalibrate=lambda: load_or_calibrate(cache_root(), force=True),
            )
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

STORE_COPY_SOURCE = """#include <stdint.h>
/* The calibration's copy loop (kf_stream_copy) with ordinary stores: every line written is
   first read into cache (write-allocate), as in a kernel that does not stream its output. */
void kf_store_copy(const float *restrict src, float *restrict dst, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < n / 64; ++b)
        for (int i = 0; i < 64; ++i) dst[b * 64 + i] = src[b * 64 + i];
    for (int64_t i = (n / 64) * 64; i < n; ++i) dst[i] = src[i];
}
"""
MAIN_SPACE: dict[str, Any] = {"gelu": "exp"}
"""The value main's space (99fb9dd) had for each parameter added since."""
COPY_FLAGS = ("-O3", "-march=native", "-fopenmp")
"""The calibration's flags; the store copy adds -fno-tree-loop-distribute-patterns so that
gcc keeps the loop rather than calling memcpy."""


def l2_bytes() -> int:
    """One core's L2 from sysfs; 256 KiB where it is not said."""
    size = Path("/sys/devices/system/cpu/cpu0/cache/index2/size")
    text = size.read_text().strip() if size.exists() else ""
    units = {"K": 1 << 10, "M": 1 << 20}
    if text[:-1].isdigit() and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return 256 << 10


def arithmetic_floor(
    template: Template, point: dict[str, Any], workload: Workload, calls: int = 300
) -> dict[str, Any]:
    """What the point's arithmetic costs when memory is free: its row function on one core
    (threads 1, no prefetch, ordinary stores that stay in cache) on rows that fit in half of
    that core's L2, the least time of `calls` calls (load only ever adds time, so the least
    is the floor), per full shape on every core."""
    spec, shape = workload.spec, workload.shape
    rows = max(1, min(shape["rows"], l2_bytes() // 2 // spec.nbytes({**shape, "rows": 1})))
    small = Workload(spec, {**shape, "rows": rows}, sets=1)
    single = {**point, "threads": 1, "schedule": "static", "prefetch": 0, "streaming": False}
    rendered = template.render(single)
    name = f"{template.name}-floor-{abs(hash(repr(sorted(single.items()))))}"
    call = native_call(compile_library(name, rendered.source, rendered.flags), small)
    least = min(call(0) for _ in range(calls))
    cores = os.cpu_count() or 1
    return {
        "rows_in_l2": rows,
        "least_ns_per_call": least,
        "ms": least * shape["rows"] / rows / cores / 1e6,
    }


def paired_fraction(
    kernel: list[int], copy: list[int], kernel_bytes: int, copy_bytes: int
) -> float:
    """The median over rounds of (kernel bytes / kernel time) / (copy bytes / copy time),
    both timed in the same round."""
    return statistics.median(
        (kernel_bytes / k) / (copy_bytes / c) for k, c in zip(kernel, copy, strict=True)
    )


FINALISTS = 3


def final_round(
    template: Template, workload: Workload, found: SearchResult, rounds: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The search's FINALISTS fastest points timed again interleaved (one point's median of
    5 calls in the search is noise on a busy host): their params, fastest first, and each
    finalist's params and times."""
    ranked = sorted((e for e in found.evaluated if "median_ms" in e), key=lambda e: e["median_ms"])
    finalists = ranked[:FINALISTS]
    calls = {}
    for place, entry in enumerate(finalists):
        rendered = template.render(entry["params"])
        library = compile_library(
            f"{template.name}-finalist-{place}", rendered.source, rendered.flags
        )
        calls[str(place)] = native_call(library, workload)
    table = summary(interleaved(calls, rounds, workload.sets), "0")
    report = []
    for k, row in table.items():
        entry = finalists[int(k)]
        report.append({"params": entry["params"], "ms_in_search": entry["median_ms"], **row})
    order = sorted(table, key=lambda k: table[k]["median_ms"])
    return [finalists[int(k)]["params"] for k in order], report


def searched_fraction(
    problem: str, budget: int, rounds: int, bandwidth_gbs: float
) -> dict[str, Any]:
    spec = BUILTIN[problem]
    template = TEMPLATES[EXAMPLE_TEMPLATES[problem]]
    workload = Workload(spec, dict(spec.default_shape))
    found = search_template(template, workload, budget, seed=1)
    ranked, finalists = final_round(template, workload, found, rounds)
    rejected = []
    for best in ranked:  # the fastest that the factory's verifier accepts
        rendered = template.render(best)
        verdict = verify(
            spec, CpuBackend(cache_dir=BUILD_DIR / "verify"), rendered.source, rendered.flags
        )
        if verdict.verified:
            break
        rejected.append({"params": best, "seed": verdict.seed, "rejection": str(verdict.rejection)})
        print(f"{problem}: a finalist failed verification: {best}: {verdict.rejection}")
    else:
        raise SystemExit(f"{problem}: no finalist passed verification: {rejected}")
    example = template.render(template.best_known)
    best_library = compile_library(f"{problem}-best", rendered.source, rendered.flags)
    points = {"searched_best": best, "example": template.best_known}
    contenders = {
        "searched_best": native_call(best_library, workload),
        "example": native_call(
            compile_library(f"{problem}-example", example.source, example.flags), workload
        ),
        "numpy": timed(lambda i: spec.baseline(workload.inputs[i]), workload),
    }
    before = {**best, **{k: v for k, v in MAIN_SPACE.items() if k in best}}
    if before != best:
        # the best point as main's space (99fb9dd) could say it: the new parameter's effect
        old = template.render(before)
        points["best_in_main_space"] = before
        contenders["best_in_main_space"] = native_call(
            compile_library(f"{problem}-main-space", old.source, old.flags), workload
        )
    errors = {}
    for name, call in contenders.items():
        call(0)
        errors[name] = workload.max_rel_error(0) if name != "numpy" else 0.0
    nt = compile_library("calibration_copy", CALIBRATION_SOURCE.read_text(), COPY_FLAGS)
    store = compile_library(
        "store_copy", STORE_COPY_SOURCE, (*COPY_FLAGS, "-fno-tree-loop-distribute-patterns")
    )
    contenders["copy_nt"] = library_call(nt, "kf_stream_copy", workload)
    contenders["copy_store"] = library_call(store, "kf_store_copy", workload)
    samples = interleaved(contenders, rounds, workload.sets)
    table: dict[str, dict[str, Any]] = {k: dict(v) for k, v in summary(samples, "numpy").items()}
    output_bytes = sum(workload.outputs[a.name].nbytes for a in spec.outputs)
    copy_bytes = 2 * workload.outputs["y"].nbytes
    for name, row in table.items():
        ns = samples[name]
        counted = copy_bytes if name.startswith("copy") else workload.nbytes
        streams = name == "copy_nt" or bool(points.get(name, {}).get("streaming", False))
        # lines written without streaming stores are read first (write-allocate)
        traffic = counted + (0 if streams else output_bytes)
        row["best_ms"] = min(ns) / 1e6
        row["bytes_counted"] = counted
        row["bytes_with_write_allocate"] = traffic
        row["store"] = "non-temporal" if streams else "write-allocate"
        row["gbs"] = counted / (row["median_ms"] / 1e3) / 1e9
        row["of_calibrated"] = row["gbs"] / bandwidth_gbs
        row["best_of_calibrated"] = counted / (row["best_ms"] / 1e3) / 1e9 / bandwidth_gbs
        row["traffic_of_calibrated"] = traffic / (row["median_ms"] / 1e3) / 1e9 / bandwidth_gbs
        row["of_copy_nt"] = paired_fraction(ns, samples["copy_nt"], counted, copy_bytes)
        same = samples["copy_nt" if streams else "copy_store"]
        row["of_copy_same_store"] = paired_fraction(ns, same, counted, copy_bytes)
        row["max_rel_error"] = errors.get(name, float("nan"))
    result: dict[str, Any] = {
        "problem": problem,
        "template": template.name,
        "shape": spec.default_shape,
        "bytes_moved": workload.nbytes,
        "search": {
            "budget": budget,
            "seconds": found.seconds,
            "best_in_search": found.best,
            "best_ms_in_search": found.best_ms,
            "finalists": finalists,
            "rejected_by_the_verifier": rejected,
            "best": best,
            "evaluated": found.evaluated,
        },
        "verified_max_rel_err": verdict.max_rel_err,
        "interleaved": table,
        "load_average": load_average(),
    }
    memory_ms = workload.nbytes / (bandwidth_gbs * 1e9) * 1e3
    floors = {n: arithmetic_floor(template, dict(p), workload) for n, p in points.items()}
    for floor in floors.values():
        floor["reachable_of_calibrated"] = memory_ms / max(memory_ms, floor["ms"])
    result["floors"] = {"memory_ms_at_calibrated": memory_ms, "arithmetic": floors}
    return result


def roofline_bound(result: dict[str, Any], ceilings: Ceilings) -> dict[str, float]:
    """The chain's least time from bench/roofline.py: max(bytes / copy bandwidth, exps / exp
    throughput), both ceilings measured in this run. Every gelu form of the template costs
    one exp per element (the sigmoid form); exp2_poly* is a cheaper exp than v_exp, whose
    rate roofline measures, so for those points the exp term is an upper estimate."""
    exps = result["shape"]["rows"] * result["shape"]["cols"]
    return {
        "exps": exps,
        "memory_ms": result["bytes_moved"] / (ceilings.copy_gbs_best * 1e9) * 1e3,
        "exp_ms": exps / ceilings.exp_per_s_all_best * 1e3,
        "bound_ms": ceilings.bound_s(result["bytes_moved"], exps) * 1e3,
    }


def print_fraction(result: dict[str, Any]) -> None:
    print(f"\n{result['problem']} ({result['template']}): best {result['search']['best']}")
    finalists = ", ".join(
        f"{f['ms_in_search']:.1f} -> {f['median_ms']:.1f}" for f in result["search"]["finalists"]
    )
    print(f"  the search's {FINALISTS} fastest, ms in the search -> interleaved: {finalists}")
    print(
        f"  {'kernel':14s} {'median ms':>9s} {'best ms':>8s} {'GB/s':>6s} {'of calib':>8s} "
        f"{'best/cal':>8s} {'+w-alloc':>8s} {'of NT copy':>10s} {'of same-store copy':>18s}"
    )
    for name, row in result["interleaved"].items():
        print(
            f"  {name:14s} {row['median_ms']:9.2f} {row['best_ms']:8.2f} {row['gbs']:6.1f} "
            f"{row['of_calibrated']:8.1%} {row['best_of_calibrated']:8.1%} "
            f"{row['traffic_of_calibrated']:8.1%} {row['of_copy_nt']:10.1%} "
            f"{row['of_copy_same_store']:9.1%} ({row['store'][:5]})"
        )
    if "roofline" in result:
        b = result["roofline"]
        print(
            f"  roofline bound {b['bound_ms']:.2f} ms (memory {b['memory_ms']:.2f} ms at the best "
            f"copy, {b['exps']:.0f} exps {b['exp_ms']:.2f} ms at the best exp rate)"
        )
    floors = result["floors"]
    print(f"  memory floor {floors['memory_ms_at_calibrated']:.2f} ms at the calibrated bandwidth")
    for name, floor in floors["arithmetic"].items():
        print(
            f"  arithmetic floor of {name}: {floor['ms']:.2f} ms (one core, rows in L2, least of "
            f"300 calls, per shape on every core): at most {floor['reachable_of_calibrated']:.0%} "
            "of the calibrated bandwidth"
        )
    print(f"  load average {result['load_average']}")


def fractions(budget: int, rounds: int, problems: tuple[str, ...]) -> None:
    started = time.time()
    loads = [load_average()]
    calibration = load_or_calibrate(cache_root())
    print(
        f"host {calibration.cpu_model}, {calibration.cores} cores; calibrated copy bandwidth "
        f"{calibration.memory_bandwidth_gbs:.1f} GB/s ({calibration.method}); load average "
        f"{loads[0]}"
    )
    found = []
    for problem in problems:
        result = searched_fraction(problem, budget, rounds, calibration.memory_bandwidth_gbs)
        if "gelu" in problem:
            ceilings = measure(copy_bytes=result["bytes_moved"], rounds=rounds)
            result["ceilings"] = ceilings.to_json()
            result["roofline"] = roofline_bound(result, ceilings)
        found.append(result)
        print_fraction(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "cpu_fractions.json"
    out.write_text(
        json.dumps(
            {
                "calibrated_bandwidth_gbs": calibration.memory_bandwidth_gbs,
                "calibration_method": calibration.method,
                "cpu_model": calibration.cpu_model,
                "results": found,
                "load_average_start": loads[0],
                "load_average_end": load_average(),
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
    parser.add_argument(
        "--fraction-problems", default=",".join(FRACTION_PROBLEMS), help="(--fractions)"
    )
    args = parser.parse_args()
    if args.fractions:
        fractions(args.budget, args.rounds, tuple(args.fraction_problems.split(",")))
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
