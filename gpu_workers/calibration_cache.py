"""A device's calibration, measured once and kept in a file keyed by the device."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from gpu_workers.atomic_file import write_atomically
from gpu_workers.results import HostCalibration


def cached_calibration(
    path: Path, measure: Callable[[], HostCalibration], *, force: bool = False
) -> HostCalibration:
    """The calibration in `path`, measuring (and keeping) it first if there is none."""
    if path.is_file() and not force:
        try:
            return msgspec.json.decode(path.read_bytes(), type=HostCalibration)
        except msgspec.DecodeError:
            pass  # an old or damaged file: measure again
    calibration = measure()
    write_atomically(path, msgspec.json.encode(calibration))
    return calibration
