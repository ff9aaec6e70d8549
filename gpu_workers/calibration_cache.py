"""A device's calibration, kept in a file keyed by the device, but only one measured on a
quiet host: ceilings measured while other work ran are too low, and a kernel judged
against them would be refused for being faster than the host "allows"."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from gpu_workers.atomic_file import write_atomically
from gpu_workers.benchmarker import QUIET_CORES
from gpu_workers.results import HostCalibration


def is_quiet(calibration: HostCalibration, quiet_cores: float = QUIET_CORES) -> bool:
    """Whether the host was known to be quiet while `calibration` was measured: at most
    `quiet_cores` cores' worth of other work (the benchmarker's threshold for a quiet
    timing run). Unknown contention is not quiet."""
    busy = calibration.host_contention_cores
    return busy is not None and busy <= quiet_cores


def cached_calibration(
    path: Path,
    measure: Callable[[], HostCalibration],
    *,
    force: bool = False,
    quiet_cores: float = QUIET_CORES,
) -> HostCalibration:
    """The quiet calibration kept in `path`; else (or with `force`) a fresh measurement,
    kept in `path` only when the host was quiet. A contended measurement is returned for
    this run (its `host_contention_cores` says so) and never written."""
    if path.is_file() and not force:
        try:
            kept = msgspec.json.decode(path.read_bytes(), type=HostCalibration)
        except msgspec.DecodeError:
            kept = None  # an old or damaged file: measure again
        if kept is not None and is_quiet(kept, quiet_cores):
            return kept
    calibration = measure()
    if is_quiet(calibration, quiet_cores):
        write_atomically(path, msgspec.json.encode(calibration))
    return calibration
