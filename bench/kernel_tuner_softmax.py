"""Kernel Tuner against the factory on row softmax 4096x4096 fp32 (issue 13's comparison).

Usage (Kernel Tuner lives in bench/.kt only, never in the package: `make bench-kt`):
  .venv/bin/python bench/kernel_tuner_softmax.py                   # budget 60, 30 rounds
  .venv/bin/python bench/kernel_tuner_softmax.py --budget 40 --rounds 20

1. Kernel Tuner 1.5.0 brute-forces the issue's 96-point space (threads 1|2, algorithm
   three-pass|online, vector width 4|8|16, unroll 1|2|4|8, fast exp 0|1: libm expf or a
   polynomial exp built with -ffast-math;
   bench/kernel_tuner_softmax.c), with its own timing and its answer check.
2. The factory's side: a TPE search over the `softmax_rows` template (the planner's
   sampler), `--budget` points, each compiled and timed in this process (not a
   `kfactory run` campaign, whose evaluations cost minutes each on this shared host).
   Its best point is then verified by the factory's verifier (every distribution).
3. One neutral interleaved run: Kernel Tuner's best, the factory's best, main's example
   kernel (the old template's best point, `streaming = true`) and numpy, rotated inputs,
   medians and paired per-round ratios, each as a fraction of the calibrated bandwidth.
Prints a table and writes bench/results/kernel_tuner_softmax.json, with the load average.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
KT_DIR = ROOT / "bench" / ".kt"

from native_harness import (  # noqa: E402
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

from gpu_workers.cache_root import cache_root  # noqa: E402
from gpu_workers.cpu.backend import CpuBackend  # noqa: E402
from gpu_workers.cpu.calibrate import load_or_calibrate  # noqa: E402
from gpu_workers.verification import verify  # noqa: E402
from kernels.builtin import BUILTIN  # noqa: E402
from kernels.templates import TEMPLATES  # noqa: E402

RESULTS = ROOT / "bench" / "results"
KT_SOURCE = ROOT / "bench" / "kernel_tuner_softmax.c"
KT_FLAGS = ("-O3", "-march=native", "-fopenmp")
KT_SPACE: dict[str, list[int]] = {
    "THREADS": [1, 2],
    "ALGORITHM": [0, 1],
    "VECTOR_WIDTH": [4, 8, 16],
    "UNROLL": [1, 2, 4, 8],
    "FAST_EXP": [0, 1],
}
SHAPE = {"rows": 4096, "cols": 4096}


def kernel_tuner_brute_force(workload: Workload) -> dict[str, Any]:
    if not (KT_DIR / "kernel_tuner").is_dir():
        raise SystemExit("Kernel Tuner is not in bench/.kt: run `make bench-kt` first")
    sys.path.append(str(KT_DIR))  # after the venv: numpy stays the project's
    import kernel_tuner  # type: ignore[import-not-found]

    x = workload.inputs[0]["x"]
    y = np.zeros_like(x)
    reference = BUILTIN["softmax"].expected({"x": x})["y"].astype(np.float32)
    started = time.time()
    results: list[dict[str, Any]] = []
    env: dict[str, Any] = {}
    for fast_exp in KT_SPACE["FAST_EXP"]:  # flags differ by FAST_EXP: one KT run each
        found, env = kernel_tuner.tune_kernel(
            "softmax_kt",
            KT_SOURCE.read_text(),
            (SHAPE["rows"], SHAPE["cols"]),
            [x, y, np.int32(SHAPE["rows"]), np.int32(SHAPE["cols"])],
            {**KT_SPACE, "FAST_EXP": [fast_exp]},
            lang="C",
            compiler_options=list(kt_flags(fast_exp)),
            answer=[None, reference, None, None],
            atol=1e-6,
            strategy="brute_force",
            iterations=7,
            verbose=False,
        )
        results += found
    seconds = time.time() - started
    valid = sorted(
        (r for r in results if isinstance(r.get("time"), float)), key=lambda r: r["time"]
    )
    return {
        "version": env.get("kernel_tuner_version", kernel_tuner.__version__),
        "evaluated": len(results),
        "timed": len(valid),
        "seconds": seconds,
        "best": {k: valid[0][k] for k in KT_SPACE},
        "best_ms_by_kernel_tuner": valid[0]["time"],
        "ranked": [{**{k: r[k] for k in KT_SPACE}, "time_ms": r["time"]} for r in valid],
    }


def kt_flags(fast_exp: int) -> tuple[str, ...]:
    """FAST_EXP = 1 is the polynomial exp built with -ffast-math (without it GCC keeps the
    exp loop's clamps and rounding strict, and the point runs 3-5x slower)."""
    return (*KT_FLAGS, "-ffast-math") if fast_exp else KT_FLAGS


def kernel_tuner_library(config: dict[str, int], name: str) -> Path:
    defines = "".join(f"#define {k} {v}\n" for k, v in config.items())
    source = defines + 'extern "C" {\n' + KT_SOURCE.read_text() + "\n}\n"
    return compile_library(name, source, kt_flags(config["FAST_EXP"]), compiler="g++")


def main_example_library() -> tuple[Path, str] | None:
    """main's kernels/examples/softmax.c (the old template's best point), when git has it."""
    proc = subprocess.run(
        ["git", "show", "main:kernels/examples/softmax.c"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    flags = tuple(proc.stdout.splitlines()[0].split(":", 1)[1].split())
    return compile_library("main_example", proc.stdout, flags), proc.stdout.splitlines()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=60, help="points the factory's search times")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--skip-kt", action="store_true", help="reuse the last brute force (its own JSON)"
    )
    parser.add_argument(
        "--skip-search", action="store_true", help="reuse the last run's factory best point"
    )
    parser.add_argument(
        "--kt-top", type=int, default=3, help="Kernel Tuner's fastest N configs (its timing)"
    )
    args = parser.parse_args()
    started = time.time()
    loads = {"start": load_average()}
    calibration = load_or_calibrate(cache_root())
    bandwidth = calibration.memory_bandwidth_gbs * 1e9
    spec = BUILTIN["softmax"]
    workload = Workload(spec, SHAPE)
    print(
        f"host {calibration.cpu_model}, {calibration.cores} cores; calibrated copy bandwidth "
        f"{calibration.memory_bandwidth_gbs:.1f} GB/s; load average {loads['start']}"
    )

    out = RESULTS / "kernel_tuner_softmax.json"
    kt_out = RESULTS / "kernel_tuner_brute_force.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.skip_kt and kt_out.exists():
        kt = json.loads(kt_out.read_text())
    else:
        kt = kernel_tuner_brute_force(workload)
        kt_out.write_text(json.dumps(kt, indent=2))
    loads["after_kernel_tuner"] = load_average()
    print(
        f"Kernel Tuner {kt['version']}: {kt['evaluated']} points in {kt['seconds']:.0f} s, "
        f"best {kt['best']} at {kt['best_ms_by_kernel_tuner']:.2f} ms (its own timing)"
    )

    template = TEMPLATES["softmax_rows"]
    if args.skip_search and out.exists():
        search = json.loads(out.read_text())["factory_search"]
    else:
        found = search_template(template, workload, args.budget, args.seed)
        search = {
            "template": template.name,
            "budget": args.budget,
            "seed": args.seed,
            "seconds": found.seconds,
            "best": found.best,
            "best_ms_in_search": found.best_ms,
            "evaluated": found.evaluated,
        }
    loads["after_search"] = load_average()
    print(
        f"factory search over {template.name}: {len(search['evaluated'])} points in "
        f"{search['seconds']:.0f} s, best {search['best']} at {search['best_ms_in_search']:.2f} ms"
    )
    rendered = template.render(search["best"])
    verdict = verify(
        spec, CpuBackend(cache_dir=BUILD_DIR / "verify"), rendered.source, rendered.flags
    )
    if not verdict.verified:
        raise SystemExit(f"the factory's best point failed verification: {verdict.rejection}")
    print(f"the factory's best point verified (max relative error {verdict.max_rel_err:.1e})")

    factory_lib = compile_library("factory_best", rendered.source, rendered.flags)
    ranked = kt.get("ranked", [kt["best"]])[: args.kt_top]
    kt_names = [f"kernel_tuner_{i + 1}" for i in range(len(ranked))]
    contenders = {
        name: native_call(
            kernel_tuner_library({k: int(config[k]) for k in KT_SPACE}, name), workload
        )
        for name, config in zip(kt_names, ranked, strict=True)
    }
    contenders["factory_best"] = native_call(factory_lib, workload)
    example = main_example_library()
    if example is not None:
        contenders["main_example"] = native_call(example[0], workload)

    contenders["numpy"] = timed(lambda i: spec.baseline(workload.inputs[i]), workload)
    copy = copy_call(workload, "x", "y")
    errors = {}
    for name, call in contenders.items():
        call(0)
        errors[name] = workload.max_rel_error(0) if name != "numpy" else 0.0
    contenders["copy_x_to_y"] = copy
    errors["copy_x_to_y"] = float("nan")
    samples = interleaved(contenders, args.rounds, workload.sets)
    loads["end"] = load_average()
    fastest_kt = min(kt_names, key=lambda n: statistics.median(samples[n]))
    table = summary(samples, fastest_kt)
    copy_ms = table["copy_x_to_y"]["median_ms"]
    for name, row in table.items():
        row["bandwidth_fraction"] = workload.nbytes / (row["median_ms"] / 1e3) / bandwidth
        row["fraction_of_copy_in_this_run"] = copy_ms / row["median_ms"]
        row["max_rel_error"] = errors[name]
    print(f"\nKernel Tuner's configs: {dict(zip(kt_names, ranked, strict=True))}")
    print(f"the fastest of them in this run: {fastest_kt}; ratios are against it")
    print(
        f"{'kernel':20s} {'median ms':>10s} {'IQR ms':>14s} {'vs KT best':>11s} "
        f"{'of bandwidth':>13s} {'of copy now':>12s} {'max rel err':>12s}"
    )
    for name, row in table.items():
        print(
            f"{name:20s} {row['median_ms']:10.2f} {row['q1_ms']:6.2f}-{row['q3_ms']:<7.2f} "
            f"{row['speedup_vs_reference']:10.2f}x {row['bandwidth_fraction']:12.1%} "
            f"{row['fraction_of_copy_in_this_run']:11.1%} "
            f"{row['max_rel_error']:12.1e}"
        )
    print(f"load average: {loads}")
    out.write_text(
        json.dumps(
            {
                "shape": SHAPE,
                "bytes_moved": workload.nbytes,
                "calibrated_bandwidth_gbs": calibration.memory_bandwidth_gbs,
                "cpu_model": calibration.cpu_model,
                "kernel_tuner": kt,
                "factory_search": search,
                "factory_best_verified_max_rel_err": verdict.max_rel_err,
                "kernel_tuner_contenders": dict(zip(kt_names, ranked, strict=True)),
                "ratios_against": fastest_kt,
                "main_example": example[1] if example else None,
                "interleaved": table,
                "load_average": loads,
                "seconds": time.time() - started,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
