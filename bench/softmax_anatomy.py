"""Where a row softmax's time goes on this host: its phases timed alone, side by side.

Usage: .venv/bin/python bench/softmax_anatomy.py [--rounds 15] [--structure 1] [--exp 6]

A structure of bench/softmax_hand.c (--structure, default 1: max; exp into an L1 row
buffer; scale with non-temporal stores) is timed beside its phases
(bench/softmax_anatomy.c), each over the whole 4096x4096 matrix with the kernel's own
loops and split of rows over threads:
- read: x once (the row max): the read traffic alone;
- write: y once with non-temporal stores: the write traffic alone;
- exp: the exp pass over a row that stays in L1, once per row: the arithmetic alone;
- read+exp: both, writing nothing;
- compute: the whole kernel on a row that stays in cache, once per row: all its
  arithmetic, no memory traffic (structures 0 and 2; structure 1's non-temporal stores
  still reach memory).
They run interleaved with the whole kernel, Kernel Tuner's best config (from
bench/results/kernel_tuner_brute_force.json, if `make bench-kt` wrote it) and the
calibration's copy, caches flushed before every call (bench/native_harness.py). The
report compares the whole kernel with the sum of its phases (no overlap) and with the
largest (perfect overlap): the gap between them is what overlapping memory and arithmetic
can still win. Writes bench/results/softmax_anatomy.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernel_tuner_softmax import KT_SPACE, SHAPE, kernel_tuner_library  # noqa: E402
from native_harness import (  # noqa: E402
    Call,
    Workload,
    compile_library,
    copy_call,
    interleaved,
    load_average,
    native_call,
)
from softmax_limit import HAND_FLAGS, HAND_SOURCE  # noqa: E402

from kernels.builtin import BUILTIN  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PHASES = ("phase_read", "phase_write", "phase_exp", "phase_read_exp", "phase_compute")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds")
    parser.add_argument("--exp", type=int, default=6, choices=(0, 4, 5, 6), help="the hand exp")
    parser.add_argument(
        "--structure", type=int, default=1, choices=(0, 1, 2), help="the hand structure"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "softmax_anatomy.json")
    args = parser.parse_args()
    workload = Workload(BUILTIN["softmax"], SHAPE)
    source = (
        f"#define STRUCTURE {args.structure}\n#define EXP {args.exp}\n"
        + HAND_SOURCE.read_text()
        + (ROOT / "bench" / "softmax_anatomy.c").read_text()
    )
    library = compile_library(f"anatomy_{args.structure}_{args.exp}", source, HAND_FLAGS)
    contenders: dict[str, Call] = {"kernel": native_call(library, workload)}
    for phase in PHASES:
        contenders[phase] = native_call(library, workload, phase)
    kt_path = RESULTS / "kernel_tuner_brute_force.json"
    if kt_path.exists():
        best = json.loads(kt_path.read_text())["ranked"][0]
        kt = kernel_tuner_library({k: int(best[k]) for k in KT_SPACE}, "kernel_tuner_best")
        contenders["kernel_tuner_best"] = native_call(kt, workload)
    contenders["copy"] = copy_call(workload, "x", "y")
    load_before = load_average()
    samples = interleaved(contenders, args.rounds, workload.sets)
    medians = {name: statistics.median(ns) / 1e6 for name, ns in samples.items()}
    kernel = samples["kernel"]

    def ratio_to_kernel(name: str) -> float:
        return statistics.median(k / p for k, p in zip(kernel, samples[name], strict=True))

    parts = ("phase_read", "phase_exp", "phase_write")
    serial = sum(medians[p] for p in parts)
    overlapped = max(medians[p] for p in parts)
    print(
        f"row softmax {SHAPE}, hand structure {args.structure}, exp {args.exp}; load {load_before}"
    )
    print(f"{'contender':20s} {'median ms':>10s} {'kernel / it':>12s}")
    for name in contenders:
        print(f"{name:20s} {medians[name]:10.2f} {ratio_to_kernel(name):11.2f}x")
    print(
        f"\nkernel {medians['kernel']:.2f} ms; its phases: serial sum {serial:.2f} ms, "
        f"perfect overlap {overlapped:.2f} ms; read+exp together {medians['phase_read_exp']:.2f}"
        f" ms against {medians['phase_read'] + medians['phase_exp']:.2f} ms apart"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "shape": SHAPE,
                "structure": args.structure,
                "exp": args.exp,
                "medians_ms": medians,
                "serial_sum_ms": serial,
                "perfect_overlap_ms": overlapped,
                "load_average": [load_before, load_average()],
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
