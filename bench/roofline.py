"""A lower bound for a CPU kernel on this host, from ceilings measured now, in one process.

Three ceilings, timed interleaved round by round so that load on a shared host hits all:
- copy bandwidth: the calibration's own all-core non-temporal copy (gpu_workers/cpu/
  calibration.c, `kf_stream_copy`), bytes = read N + write N, as the calibration counts them;
- exp throughput: the softmax template's vector exps (`sm_exp`: cephes, exp2_5, exp2_4),
  at every vector width the template offers on this host (simdlen 8 and 16, and
  explicit AVX-512 where the CPU has it), -O3 -march=native -ffast-math, as the softmax
  exp pass uses them: load, subtract, exp, accumulate, on an L1-resident row, on one core
  and on every core. The ceiling is the fastest of them (`exp_variant` names it): the
  cheapest exp that passes softmax's tolerance, at the widest vectors that pay;
- softmax arithmetic: everything a row softmax must compute per element, on the same
  L1-resident rows with each of those exps, on every core: a max pass, an exp pass
  (subtract, exp, store, sum) and a scale pass (load, multiply, store). No softmax does
  less: the max must be known before the exps (an online form computes each exp twice),
  and the sum before the scale. The ceiling is the fastest (`softmax_variant`).

A kernel that moves B bytes and computes E exps needs at least
max(B / copy bandwidth, E / exp throughput) seconds: `Ceilings.bound_s(B, E)`. A row
softmax of E elements needs at least max(B / copy bandwidth, E / softmax arithmetic rate):
`Ceilings.softmax_bound_s(B, E)`, the tighter bound, each of its two parts reached by a
measured kernel (the copy; the arithmetic sweep, itself a softmax of cache-resident rows).

API (the exp bound also serves rmsnorm, layernorm and the fused chain):
  ceilings = measure(copy_bytes=..., rounds=...)   # Ceilings, best and median per ceiling
  ceilings.bound_s(bytes_moved, exps)              # seconds, from the best (ceiling) values
  ceilings.softmax_bound_s(bytes_moved, elements)  # the same with softmax's arithmetic
  ceilings.to_json()                               # a plain dict for a results file

Usage: python bench/roofline.py [--rows 4096 --cols 4096] [--rounds 15]
prints the ceilings and softmax's bounds (2 x rows x cols x 4 bytes, rows x cols exps).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from native_harness import aligned, compile_library, load_average  # noqa: E402

from gpu_workers.cpu.calibrate import CALIBRATION_SOURCE  # noqa: E402
from kernels.templates import TEMPLATES  # noqa: E402

EXP_ROW_FLOATS = 2048
"""8 KiB per thread: stays in L1 on any x86-64."""
EXP_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp")
COPY_FLAGS = ("-O3", "-march=native", "-fopenmp")
"""The calibration's own flags (gpu_workers/cpu/calibrate.py)."""

EXP_SWEEP = """
#include <omp.h>
/* Each of `threads` threads: `reps` sweeps of exp(x - 1) over its own L1-resident row of n
   floats, summed into 4 accumulators. Returns the sum (so nothing is optimised away). */
double kf_exp_sweeps(const float *x, int64_t n, int64_t reps, int threads) {
    double total = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        float row[n] __attribute__((aligned(64)));
        memcpy(row, x, (size_t)n * sizeof(float));
        const kf_v one = v_set1(1.0f);
        kf_v a0 = v_set1(0.0f), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t r = 0; r < reps; ++r) {
            for (int64_t j = 0; j + 4 * KF_W <= n; j += 4 * KF_W) {
                a0 = v_add(a0, sm_exp(v_sub(v_load(row + j), one)));
                a1 = v_add(a1, sm_exp(v_sub(v_load(row + j + KF_W), one)));
                a2 = v_add(a2, sm_exp(v_sub(v_load(row + j + 2 * KF_W), one)));
                a3 = v_add(a3, sm_exp(v_sub(v_load(row + j + 3 * KF_W), one)));
            }
            __asm__ volatile("" : : : "memory");
        }
        total += v_hsum(v_add(v_add(a0, a1), v_add(a2, a3)));
    }
    return total;
}
"""


SOFTMAX_SWEEP = """
/* Each of `threads` threads: `reps` softmaxes of its own L1-resident row of n floats (the
   row, the exps and the output: 3 n floats): a max pass, exp(x - max) stored and summed,
   then the exps scaled by 1 / sum; U vectors per step. Returns the sum of every row's last
   output. */
double kf_softmax_sweeps_UNROLL(const float *x, int64_t n, int64_t reps, int threads) {
    enum { U = UNROLL };
    double total = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        float row[n] __attribute__((aligned(64)));
        float e[n] __attribute__((aligned(64)));
        float y[n] __attribute__((aligned(64)));
        memcpy(row, x, (size_t)n * sizeof(float));
        for (int64_t r = 0; r < reps; ++r) {
            kf_v m[U], a[U];
            for (int u = 0; u < U; ++u) m[u] = v_set1(-FLT_MAX), a[u] = v_set1(0.0f);
            for (int64_t j = 0; j + U * KF_W <= n; j += U * KF_W)
                for (int u = 0; u < U; ++u) m[u] = v_max(m[u], v_load(row + j + u * KF_W));
            for (int u = 1; u < U; ++u) m[0] = v_max(m[0], m[u]);
            const kf_v vm = v_set1(v_hmax(m[0]));
            for (int64_t j = 0; j + U * KF_W <= n; j += U * KF_W)
                for (int u = 0; u < U; ++u) {
                    const kf_v ev = sm_exp(v_sub(v_load(row + j + u * KF_W), vm));
                    v_store(e + j + u * KF_W, ev);
                    a[u] = v_add(a[u], ev);
                }
            for (int u = 1; u < U; ++u) a[0] = v_add(a[0], a[u]);
            const kf_v inv = v_set1(1.0f / v_hsum(a[0]));
            for (int64_t j = 0; j + KF_W <= n; j += KF_W)
                v_store(y + j, v_mul(v_load(e + j), inv));
            __asm__ volatile("" : : : "memory");
            total += y[n - 1];
        }
    }
    return total;
}
"""
SWEEP_UNROLLS = (1, 2, 4)
"""The softmax arithmetic is timed at each: which one the compiler schedules best varies."""


def exp_sources() -> dict[str, str]:
    """For each exp of the softmax template and each vector width it offers on this host
    (its constraints decide: explicit AVX-512 only where the CPU has it), the template's
    kernel at that point with EXP_SWEEP and SOFTMAX_SWEEP after it, which call its
    `sm_exp`."""
    template = TEMPLATES["softmax_rows"]
    space = template.space()
    sources = {}
    for exp in space["exp"]:
        for simdlen in space["simdlen"]:
            for isa in space["isa"]:
                point = {**template.best_known, "exp": exp, "simdlen": simdlen, "isa": isa}
                if template.is_valid(point):
                    label = f"{exp} simdlen {simdlen} {isa}"
                    sources[label] = (
                        template.render(point).source
                        + EXP_SWEEP
                        + "".join(
                            SOFTMAX_SWEEP.replace("UNROLL", str(unroll)) for unroll in SWEEP_UNROLLS
                        )
                    )
    return sources


@dataclass(frozen=True)
class Ceilings:
    """This host's ceilings as measured by `measure` (best = the ceiling, median = typical
    under the load at the time)."""

    copy_bytes: int
    copy_gbs_best: float
    copy_gbs_median: float
    threads: int
    exp_per_s_core_best: float
    exp_per_s_core_median: float
    exp_per_s_all_best: float
    exp_per_s_all_median: float
    exp_variant: str
    """The exp (and vector width) of the ceiling: the fastest on every core."""
    exp_variants_all_best: dict[str, float]
    """Each exp's best throughput on every core (exps per second)."""
    softmax_per_s_all_best: float
    """Elements per second of softmax's arithmetic (SOFTMAX_SWEEP) on every core."""
    softmax_per_s_all_median: float
    softmax_variant: str
    """The exp, vector width and unroll of the fastest softmax arithmetic."""
    softmax_variants_all_best: dict[str, float]
    """Each softmax arithmetic's best rate on every core (elements per second)."""
    rounds: int
    load_average_before: list[float]
    load_average_after: list[float]

    def bound_s(self, bytes_moved: float, exps: float) -> float:
        """The least time a kernel moving `bytes_moved` bytes and computing `exps` exps on
        every core can take: max(bytes / copy bandwidth, exps / exp throughput)."""
        return max(bytes_moved / (self.copy_gbs_best * 1e9), exps / self.exp_per_s_all_best)

    def softmax_bound_s(self, bytes_moved: float, elements: float) -> float:
        """The least time a row softmax of `elements` elements moving `bytes_moved` bytes
        on every core can take: max(bytes / copy bandwidth, elements / softmax arithmetic
        rate)."""
        return max(bytes_moved / (self.copy_gbs_best * 1e9), elements / self.softmax_per_s_all_best)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def measure(copy_bytes: int = 128 << 20, rounds: int = 15, exp_reps: int = 2000) -> Ceilings:
    """Copy bandwidth for `copy_bytes` (read + write; each buffer holds half) and exp
    throughput on one core and on all cores, interleaved over `rounds` rounds after one
    warm-up round."""
    before = load_average()
    copy_lib = ctypes.CDLL(
        str(compile_library("roofline_copy", CALIBRATION_SOURCE.read_text(), COPY_FLAGS))
    )
    copy = copy_lib.kf_stream_copy
    copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    copy.restype = None
    sweeps: dict[str, Any] = {}
    softmaxes: dict[str, Any] = {}
    for n_variant, (label, source) in enumerate(exp_sources().items()):
        library = ctypes.CDLL(str(compile_library(f"roofline_exp_{n_variant}", source, EXP_FLAGS)))
        functions = [(sweeps, label, library.kf_exp_sweeps)] + [
            (softmaxes, f"{label} unroll {u}", getattr(library, f"kf_softmax_sweeps_{u}"))
            for u in SWEEP_UNROLLS
        ]
        for table, name, function in functions:
            function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
            function.restype = ctypes.c_double
            table[name] = function

    n = copy_bytes // 8
    rng = np.random.default_rng(0)
    src = aligned(rng.standard_normal(n, dtype=np.float32))
    dst = aligned(rng.standard_normal(n, dtype=np.float32))
    row = aligned(rng.standard_normal(EXP_ROW_FLOATS, dtype=np.float32))
    threads = os.cpu_count() or 1

    expected = np.exp(row.astype(np.float64) - row.max())
    last = expected[-1] / expected.sum()
    for label, softmax in softmaxes.items():
        got = softmax(row.ctypes.data, EXP_ROW_FLOATS, 1, 1)
        if not abs(got - last) <= 1e-4 * last:
            raise RuntimeError(f"the softmax sweep of {label} computed {got}, not {last}")

    def time_copy() -> float:
        started = time.perf_counter()
        copy(src.ctypes.data, dst.ctypes.data, n)
        return time.perf_counter() - started

    def time_sweep(table: dict[str, Any], label: str, t: int) -> float:
        started = time.perf_counter()
        total = table[label](row.ctypes.data, EXP_ROW_FLOATS, exp_reps, t)
        elapsed = time.perf_counter() - started
        if not np.isfinite(total) or total <= 0.0:
            raise RuntimeError(f"the sweep of {label} returned {total}")
        return elapsed

    copy_s: list[float] = []
    one_s: dict[str, list[float]] = {label: [] for label in sweeps}
    all_s: dict[str, list[float]] = {label: [] for label in sweeps}
    softmax_s: dict[str, list[float]] = {label: [] for label in softmaxes}
    for r in range(rounds + 1):
        copied = time_copy()
        samples = {
            label: (time_sweep(sweeps, label, 1), time_sweep(sweeps, label, threads))
            for label in sweeps
        }
        softmax = {label: time_sweep(softmaxes, label, threads) for label in softmaxes}
        if r:
            copy_s.append(copied)
            for label, (one, every) in samples.items():
                one_s[label].append(one)
                all_s[label].append(every)
            for label, seconds in softmax.items():
                softmax_s[label].append(seconds)
    if not np.array_equal(src, dst):
        raise RuntimeError("the calibration copy kernel produced a wrong copy")
    fastest = min(all_s, key=lambda label: min(all_s[label]))
    fastest_softmax = min(softmax_s, key=lambda label: min(softmax_s[label]))
    moved = 2 * n * 4
    exps = EXP_ROW_FLOATS * exp_reps
    return Ceilings(
        copy_bytes=moved,
        copy_gbs_best=moved / min(copy_s) / 1e9,
        copy_gbs_median=moved / statistics.median(copy_s) / 1e9,
        threads=threads,
        exp_per_s_core_best=exps / min(one_s[fastest]),
        exp_per_s_core_median=exps / statistics.median(one_s[fastest]),
        exp_per_s_all_best=threads * exps / min(all_s[fastest]),
        exp_per_s_all_median=threads * exps / statistics.median(all_s[fastest]),
        exp_variant=fastest,
        exp_variants_all_best={label: threads * exps / min(all_s[label]) for label in all_s},
        softmax_per_s_all_best=threads * exps / min(softmax_s[fastest_softmax]),
        softmax_per_s_all_median=threads * exps / statistics.median(softmax_s[fastest_softmax]),
        softmax_variant=fastest_softmax,
        softmax_variants_all_best={
            label: threads * exps / min(softmax_s[label]) for label in softmax_s
        },
        rounds=rounds,
        load_average_before=before,
        load_average_after=load_average(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    elements = args.rows * args.cols
    ceilings = measure(copy_bytes=2 * elements * 4, rounds=args.rounds)
    bound = ceilings.bound_s(2 * elements * 4, elements)
    softmax_bound = ceilings.softmax_bound_s(2 * elements * 4, elements)
    report = {
        **ceilings.to_json(),
        "softmax": {
            "rows": args.rows,
            "cols": args.cols,
            "exp_bound_ms": bound * 1e3,
            "bound_ms": softmax_bound * 1e3,
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    c = ceilings
    print(f"load average {c.load_average_before} -> {c.load_average_after}, {c.rounds} rounds")
    print(
        f"copy ({c.copy_bytes >> 20} MiB moved): best {c.copy_gbs_best:.1f} GB/s, "
        f"median {c.copy_gbs_median:.1f} GB/s"
    )
    for label, rate in c.exp_variants_all_best.items():
        print(f"exp {label}, {c.threads} cores: best {rate / 1e9:.2f} G/s")
    print(
        f"exp ({c.exp_variant}), one core: best {c.exp_per_s_core_best / 1e9:.2f} G/s, "
        f"median {c.exp_per_s_core_median / 1e9:.2f} G/s"
    )
    print(
        f"exp ({c.exp_variant}), {c.threads} cores: best {c.exp_per_s_all_best / 1e9:.2f} G/s, "
        f"median {c.exp_per_s_all_median / 1e9:.2f} G/s"
    )
    for label, rate in c.softmax_variants_all_best.items():
        print(f"softmax arithmetic {label}, {c.threads} cores: best {rate / 1e9:.2f} G/s")
    print(
        f"softmax arithmetic ({c.softmax_variant}), {c.threads} cores: best "
        f"{c.softmax_per_s_all_best / 1e9:.2f} G elements/s, "
        f"median {c.softmax_per_s_all_median / 1e9:.2f}"
    )
    memory_ms = 2 * elements * 4 / (c.copy_gbs_best * 1e9) * 1e3
    exp_ms = elements / c.exp_per_s_all_best * 1e3
    arithmetic_ms = elements / c.softmax_per_s_all_best * 1e3
    print(
        f"softmax {args.rows}x{args.cols}: bound {softmax_bound * 1e3:.2f} ms "
        f"(memory {memory_ms:.2f} ms, softmax arithmetic {arithmetic_ms:.2f} ms); "
        f"with the exps alone {bound * 1e3:.2f} ms (exp {exp_ms:.2f} ms)"
    )


if __name__ == "__main__":
    main()
