"""Fusion figures: each partition of residual_rmsnorm_gelu against the unfused numpy chain.

Usage:
  .venv/bin/python bench/fusion.py                         # default shape 4096x4096
  .venv/bin/python bench/fusion.py --shape rows=1024,cols=8192

For every partition of the chain, the kernel generated from the fusion IR with the
hand-picked parameters (`best_known_for`) is verified, then timed by the real
benchmarker against the float32 numpy baseline (the unfused per-op chain, which is
`Problem.baseline`) and the hand-written fused template (the incumbent), all three
interleaved in one run, so the ratios hold even when other work loads the host. The
hand template is also timed on its own. Prints a table; writes bench/results/fusion.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import msgspec

from gpu_workers.benchmarking import BenchmarkRequest, benchmark
from gpu_workers.cache_root import cache_root
from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.cpu.build import CompiledKernel
from gpu_workers.cpu.calibrate import load_or_calibrate
from gpu_workers.cpu.toolchain import default_cache_dir
from gpu_workers.results import BenchmarkResult
from gpu_workers.verification import verify
from kernels.builtin import BUILTIN
from kernels.fusion import best_known_for, fusion_space, partitions, plan
from kernels.templates import TEMPLATES

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PROBLEM = "residual_rmsnorm_gelu"


def _shape(text: str | None) -> dict[str, int] | None:
    if not text:
        return None
    return {k: int(v) for k, v in (part.split("=") for part in text.split(","))}


def measure(
    label: str,
    params: dict[str, Any],
    source: str,
    flags: tuple[str, ...],
    backend: CpuBackend,
    shape: dict[str, int] | None,
    incumbent: CompiledKernel | None,
) -> dict[str, Any]:
    problem = BUILTIN[PROBLEM]
    row: dict[str, Any] = {"kernel": label, "params": params, "flags": list(flags)}
    verdict = verify(problem, backend, source, flags)
    if not verdict.verified:
        assert verdict.rejection is not None
        return {**row, "verdict": f"rejected {verdict.rejection.stage}/{verdict.rejection.reason}"}
    build = backend.compile(problem, source, flags).build
    assert build is not None  # it was just verified
    calibration = load_or_calibrate(cache_root())
    result = benchmark(
        BenchmarkRequest(
            problem,
            backend,
            build,
            calibration,
            incumbent=incumbent,
            shape=shape,
            recalibrate=lambda: load_or_calibrate(cache_root(), force=True),
        )
    )
    if not isinstance(result, BenchmarkResult):
        return {**row, "verdict": f"rejected {result.stage}/{result.reason}: {result.message}"}
    return {
        **row,
        "verdict": "verified",
        "shape": result.shape,
        "median_ns": result.kernel.median_ns,
        "iqr_ns": result.kernel.iqr_ns,
        "baseline_ns": result.baseline.median_ns,
        "speedup": result.speedup,
        "hand_template_ns": result.incumbent.median_ns if result.incumbent else None,
        "speedup_vs_hand_template": result.speedup_vs_incumbent,
        "roofline_fraction": result.roofline_fraction,
        "host_contention_cores": result.host_contention_cores,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", help="NAME=INT pairs (default: the problem's default shape)")
    args = parser.parse_args()
    started = time.time()
    problem = BUILTIN[PROBLEM]
    shape = _shape(args.shape)
    backend = CpuBackend(cache_dir=default_cache_dir())
    calibration = load_or_calibrate(cache_root())
    space = fusion_space(problem, "cpu")
    template = TEMPLATES["residual_rmsnorm_gelu_fused"]
    rendered = template.render(template.best_known)
    hand = backend.compile(problem, rendered.source, rendered.flags).build
    rows = []
    for partition in partitions(problem.graph):
        params = best_known_for(space, partition.key)
        fused = plan(problem, partition, params)
        rows.append(
            measure(partition.key, fused.params, fused.source, fused.flags, backend, shape, hand)
        )
    rows.append(
        measure(
            "hand template (fused)",
            dict(template.best_known),
            rendered.source,
            rendered.flags,
            backend,
            shape,
            None,
        )
    )
    print(
        f"{PROBLEM} at {shape or problem.default_shape}; baseline = the unfused numpy chain "
        f"(Problem.baseline); host bandwidth {calibration.memory_bandwidth_gbs:.1f} GB/s"
    )
    print(
        f"{'kernel':22s} {'median ms':>10s} {'IQR ms':>7s} {'numpy ms':>9s} {'speedup':>8s} "
        f"{'hand ms':>8s} {'vs hand':>8s} {'roofline':>9s} {'busy':>5s}  params"
    )
    for r in rows:
        if r["verdict"] != "verified":
            print(f"{r['kernel']:22s} {r['verdict']}")
            continue
        shown = {k: v for k, v in r["params"].items() if k not in ("partition", "flags")}
        hand_ms = f"{r['hand_template_ns'] / 1e6:8.3f}" if r["hand_template_ns"] else f"{'-':>8s}"
        vs_hand = r["speedup_vs_hand_template"]
        vs_text = f"{vs_hand:7.2f}x" if vs_hand else f"{'-':>8s}"
        print(
            f"{r['kernel']:22s} {r['median_ns'] / 1e6:10.3f} {r['iqr_ns'] / 1e6:7.3f} "
            f"{r['baseline_ns'] / 1e6:9.3f} {r['speedup']:7.2f}x {hand_ms} {vs_text} "
            f"{r['roofline_fraction']:9.3f} {r['host_contention_cores'] or 0:5.2f}  {shown}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "fusion.json"
    out.write_text(
        json.dumps(
            {
                "problem": PROBLEM,
                "calibration": msgspec.to_builtins(calibration),
                "rows": rows,
                "seconds": time.time() - started,
            },
            indent=2,
        )
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
