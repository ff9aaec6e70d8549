"""The device back end for a campaign target, shared by the verifier and benchmarker."""

from __future__ import annotations

import hashlib
from functools import cache

from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.cpu.calibrate import load_or_calibrate
from gpu_workers.cpu.compiler import default_cache_dir
from gpu_workers.results import HostCalibration


class UnsupportedTarget(ValueError):
    """No back end on this host serves this target."""


@cache
def backend_for(target: str) -> CpuBackend:
    if target != "cpu":
        raise UnsupportedTarget(f"target {target!r} has no back end on this host yet")
    return CpuBackend(cache_dir=default_cache_dir())


@cache
def calibration_for(target: str) -> HostCalibration:
    backend_for(target)
    return load_or_calibrate(default_cache_dir().parent)


def recalibrate(target: str) -> HostCalibration:
    """Measure the host again (a ceiling measured while it was busy can be too low)."""
    calibration_for.cache_clear()
    backend_for(target)
    return load_or_calibrate(default_cache_dir().parent, force=True)


def source_hash(source: str, flags: list[str] | tuple[str, ...]) -> str:
    """The identity of a kernel: its source and the flags it is built with."""
    return hashlib.sha256(("// flags: " + " ".join(flags) + "\n" + source).encode()).hexdigest()
