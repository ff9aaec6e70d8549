"""Measure this host's ceilings (bandwidth, fp32 peak) on a quiet host and cache them per
host; a measurement taken while other work ran is kept for a few minutes only.

The measuring kernels (calibration.c, ours) run in the sandboxed driver: an all-core copy
of `COPY_BYTES` with non-temporal stores (bytes read plus written), a numpy float32 (BLAS)
matmul of `SGEMM_N`^3, and all-core FMA chains in the widest vectors the CPU has; the fp32
peak is the higher of the last two. A busy host is measured again, up to `ATTEMPTS` runs,
waiting `BACKOFF_S` and then twice as long each time, and each ceiling keeps its best run
(other work only lowers a ceiling). The cache (`gpu_workers.calibration_cache`) is keyed
by host name, CPU model, core count and last-level cache size.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import socket
import time
from pathlib import Path

import msgspec

from gpu_workers.cache_root import cache_root
from gpu_workers.calibration_cache import cached_calibration, is_quiet
from gpu_workers.compile_failure import CompileFailure
from gpu_workers.cpu import protocol as p
from gpu_workers.cpu.build import compile_kernel
from gpu_workers.held_folder import held_folder
from gpu_workers.results import HostCalibration
from gpu_workers.runner_files import read_reply, write_request
from gpu_workers.sandbox import Limits, run_sandboxed
from gpu_workers.sandbox_outcome import contention
from kernels.host_isa import cpuinfo

CALIBRATION_SOURCE = Path(__file__).with_name("calibration.c")
COPY_BYTES = 512 << 20
SGEMM_N = 2048
FMA_ITERATIONS = 50_000_000


class CalibrationError(RuntimeError):
    """The host could not be measured; the message says why."""


def cpu_model() -> str:
    return cpuinfo().get("model name") or platform.processor() or "unknown"


def llc_bytes() -> int:
    """Size of the largest cache level of cpu0, from sysfs (0 when unknown)."""
    best_level, best_size = -1, 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        size = int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
        if level > best_level:
            best_level, best_size = level, size
    return best_size


def host_key() -> str:
    identity = f"{socket.gethostname()}|{cpu_model()}|{os.cpu_count()}|{llc_bytes()}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def calibration_path(cache_dir: Path | None = None) -> Path:
    base = cache_dir or cache_root()
    return base / f"host-calibration-{host_key()}.json"


def load_or_calibrate(
    cache_dir: Path | None = None,
    *,
    force: bool = False,
    attempts: int | None = None,
    backoff_s: float | None = None,
    sizes: CalibrationSizes | None = None,
) -> HostCalibration:
    """This host's calibration: the cached one if it was measured on a quiet host, else
    measured now (always with `force`) and cached only if the host was quiet."""
    return cached_calibration(
        calibration_path(cache_dir),
        lambda: measure(cache_dir, attempts=attempts, backoff_s=backoff_s, sizes=sizes),
        force=force,
    )


ATTEMPTS = 3
BACKOFF_S = 3.0
"""Wait this long before the second measurement, twice as long before the third, ..."""


class CalibrationSizes(msgspec.Struct, frozen=True):
    copy_bytes: int = COPY_BYTES
    sgemm_n: int = SGEMM_N
    fma_iterations: int = FMA_ITERATIONS


def measure(
    cache_dir: Path | None = None,
    *,
    attempts: int | None = None,
    backoff_s: float | None = None,
    sizes: CalibrationSizes | None = None,
) -> HostCalibration:
    """Measure until the host was quiet, waiting longer after each busy run (at most
    `attempts` runs); keep each ceiling's best value, since a ceiling is the most the
    host can do and other work only ever lowers it. The result records the contention of
    the quietest run; when no run was quiet its method says so, and the calibration
    cache does not keep it."""
    attempts = ATTEMPTS if attempts is None else max(1, attempts)
    backoff_s = BACKOFF_S if backoff_s is None else backoff_s
    runs: list[HostCalibration] = []
    for attempt in range(attempts):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        runs.append(_measure_once(cache_dir, sizes or CalibrationSizes()))
        if is_quiet(runs[-1]):
            break
    quiet = [c for c in runs if is_quiet(c)]
    best = max(runs, key=lambda c: c.memory_bandwidth_gbs)
    sgemm = max(c.sgemm_gflops for c in runs)
    fma = max(c.fma_peak_gflops for c in runs)
    known = [c.host_contention_cores for c in runs if c.host_contention_cores is not None]
    busy = min(known) if known else None
    if quiet:
        verdict = f"a quiet host ({busy:.2f} cores of other work)"
    elif busy is None:
        verdict = "contention unknown: kept for minutes only"
    else:
        verdict = f"contended ({busy:.2f} cores of other work at best): kept for minutes only"
    return msgspec.structs.replace(
        best,
        sgemm_gflops=sgemm,
        fma_peak_gflops=fma,
        peak_fp32_gflops=max(sgemm, fma),
        numpy_copy_bandwidth_gbs=max(c.numpy_copy_bandwidth_gbs for c in runs),
        host_contention_cores=busy,
        method=f"{best.method}; best of {len(runs)} run(s), {verdict}",
    )


def _measure_once(cache_dir: Path | None, sizes: CalibrationSizes) -> HostCalibration:
    compiled = compile_kernel(
        CALIBRATION_SOURCE.read_text(),
        ("-O3", "-march=native", "-fopenmp"),
        prototype="void kf_stream_copy(const float *src, float *dst, int64_t n)",
        cache_dir=(cache_dir / "cpu-kernels") if cache_dir else None,
        trusted_assembler=True,  # empty asm statements keep the FMA chains in registers
    )
    if isinstance(compiled, CompileFailure):
        raise CalibrationError(f"calibration kernels failed to compile: {compiled.log}")
    job = p.CalibrateJob(
        library=compiled.library,
        copy_bytes=sizes.copy_bytes,
        sgemm_n=sizes.sgemm_n,
        fma_iterations=sizes.fma_iterations,
    )
    with held_folder("kf-calibrate-") as workdir:
        write_request(workdir, job)
        outcome = run_sandboxed(
            "gpu_workers.cpu.runner",
            [],
            workdir=workdir,
            limits=Limits(cpu_seconds=600, address_space_bytes=16 << 30, wall_seconds=300),
        )
        reply = read_reply(workdir, p.Reply)
        if not outcome.ok or not isinstance(reply, p.CalibrateReply):
            raise CalibrationError(
                f"calibration run failed (exit {outcome.returncode}, {outcome.signal_name}): "
                f"{outcome.stderr[-2000:]}"
            )
        busy = contention(outcome)
    sgemm = 2.0 * reply.sgemm_n**3 / reply.sgemm_seconds / 1e9
    fma = reply.fma_flops / reply.fma_seconds / 1e9
    return HostCalibration(
        host=socket.gethostname(),
        cpu_model=cpu_model(),
        cores=os.cpu_count() or 1,
        llc_bytes=llc_bytes(),
        memory_bandwidth_gbs=reply.copy_bytes / reply.copy_seconds / 1e9,
        numpy_copy_bandwidth_gbs=reply.copy_bytes / reply.numpy_copy_seconds / 1e9,
        peak_fp32_gflops=max(sgemm, fma),
        sgemm_gflops=sgemm,
        fma_peak_gflops=fma,
        streaming_stores=reply.streaming_stores,
        host_contention_cores=busy,
        measured_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        method=(
            f"best of 15 after 1 s warm-up: all-core copy of {sizes.copy_bytes >> 20} MiB, "
            "non-temporal stores "
            f"(bytes read + written); numpy float32 {sizes.sgemm_n}^3 matmul; "
            "all-core FMA chains in the widest vectors the CPU has"
        ),
    )
