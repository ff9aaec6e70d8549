"""A device's calibration, kept in a file keyed by the device: one measured on a quiet
host for good; one measured while other work ran (its ceilings may be too low, and a
kernel judged against them refused for being faster than the host "allows") only for
`CONTENDED_KEPT_SECONDS` (five minutes), so that every check and test of those minutes
does not measure again. Quiet means at most `QUIET_CORES` cores' worth of other work, the
benchmarker's threshold for a quiet timing run."""

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
    target = path if is_quiet(calibration, quiet_cores) else contended_path(path)
    write_atomically(target, msgspec.json.encode(calibration))
    return calibration
