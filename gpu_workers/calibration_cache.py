"""A device's calibration, kept in a file keyed by the device: one measured on a quiet
host for good; one measured while other work ran (its ceilings may be too low, and a
kernel judged against them refused for being faster than the host "allows") only for
`CONTENDED_KEPT_SECONDS` (five minutes), so that every check and test of those minutes
does not measure again. Quiet means at most `QUIET_CORES` cores' worth of other work, the
benchmarker's threshold for a quiet timing run. A quiet measurement taken again (a forced
recalibration) keeps each ceiling's higher value (`best_of`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from gpu_workers.atomic_file import write_atomically
from gpu_workers.benchmarking import QUIET_CORES
from gpu_workers.results import HostCalibration


def is_quiet(calibration: HostCalibration, quiet_cores: float = QUIET_CORES) -> bool:
    """Whether the host was known to be quiet while `calibration` was measured: at most
    `quiet_cores` cores' worth of other work (the benchmarker's threshold for a quiet
    timing run). Unknown contention is not quiet."""
    busy = calibration.host_contention_cores
    return busy is not None and busy <= quiet_cores


CONTENDED_KEPT_SECONDS = 300.0
"""How long a calibration measured on a busy host is used (by any process) before the
host is measured again; a quiet one is kept for good."""


def contended_path(path: Path) -> Path:
    return path.with_name(path.stem + ".contended.json")


def _read(path: Path) -> HostCalibration | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=HostCalibration)
    except (OSError, msgspec.DecodeError):
        return None  # missing, old or damaged: measure again


def cached_calibration(
    path: Path,
    measure: Callable[[], HostCalibration],
    *,
    force: bool = False,
    quiet_cores: float = QUIET_CORES,
) -> HostCalibration:
    """The quiet calibration kept in `path`; else a contended one measured less than
    CONTENDED_KEPT_SECONDS ago (kept beside it); else (or with `force`) a fresh
    measurement, kept in `path` when the host was quiet, beside it for a while when not.
    A contended calibration says so (`host_contention_cores`)."""
    if not force:
        kept = _read(path)
        if kept is not None and is_quiet(kept, quiet_cores):
            return kept
        recent = contended_path(path)
        with contextlib.suppress(OSError):
            if time.time() - recent.stat().st_mtime < CONTENDED_KEPT_SECONDS:
                contended = _read(recent)
                if contended is not None:
                    return contended
    calibration = measure()
    quiet = is_quiet(calibration, quiet_cores)
    kept = _read(path) if quiet else None
    if kept is not None and is_quiet(kept, quiet_cores):
        calibration = best_of(kept, calibration)
    target = path if quiet else contended_path(path)
    write_atomically(target, msgspec.json.encode(calibration))
    return calibration


def best_of(kept: HostCalibration, fresh: HostCalibration) -> HostCalibration:
    """Two quiet measurements of one host, each ceiling the higher of the two: other work
    only lowers a ceiling, and a quiet host by CPU time can still be short of memory
    bandwidth (another guest on the machine), so a measurement that read low is not kept
    for good once a better one is seen."""
    by_dtype = dict(kept.peak_gflops_by_dtype)
    for dtype, peak in fresh.peak_gflops_by_dtype.items():
        by_dtype[dtype] = max(peak, by_dtype.get(dtype, 0.0))
    return msgspec.structs.replace(
        fresh,
        memory_bandwidth_gbs=max(kept.memory_bandwidth_gbs, fresh.memory_bandwidth_gbs),
        numpy_copy_bandwidth_gbs=max(kept.numpy_copy_bandwidth_gbs, fresh.numpy_copy_bandwidth_gbs),
        peak_fp32_gflops=max(kept.peak_fp32_gflops, fresh.peak_fp32_gflops),
        sgemm_gflops=max(kept.sgemm_gflops, fresh.sgemm_gflops),
        fma_peak_gflops=max(kept.fma_peak_gflops, fresh.fma_peak_gflops),
        peak_gflops_by_dtype=by_dtype,
        method=f"{fresh.method}; each ceiling the higher of this and the quiet measurement "
        f"of {kept.measured_at}",
    )
