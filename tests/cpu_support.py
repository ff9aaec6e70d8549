"""Shared fixtures for the kernel tests: a private compile cache and a calibrated host."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.cpu.calibrate import load_or_calibrate
from gpu_workers.results import HostCalibration
from gpu_workers.sandbox import Limits
from tests.session_share import locked, shared_dir

PLANTED = Path(__file__).parent / "planted"
EXAMPLES = Path(__file__).parent.parent / "kernels" / "examples"
FLAGS = ("-O3", "-march=native", "-fopenmp")
TEST_LIMITS = Limits(cpu_seconds=30, address_space_bytes=4 << 30, wall_seconds=30.0)
"""A check runs ~70 trials (fixed and drawn shapes, nine distributions): room for a busy host."""


def planted(name: str) -> str:
    return (PLANTED / f"{name}.c").read_text()


@pytest.fixture(scope="session")
def kf_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's compile cache and calibration, one for all its xdist workers."""
    return shared_dir(tmp_path_factory, "kf-cache")


@pytest.fixture(scope="session")
def cpu_backend(kf_cache: Path) -> CpuBackend:
    return CpuBackend(cache_dir=kf_cache / "cpu-kernels", verify_limits=TEST_LIMITS)


def _session_calibration(kf_cache: Path) -> HostCalibration:
    # Measured by one worker, read by the others. A test session keeps the host busy: one
    # run, not the runs and backoff that wait for a quiet host (it is kept for minutes).
    with locked(kf_cache):
        return load_or_calibrate(kf_cache, attempts=1)


@pytest.fixture(scope="session")
def calibration(kf_cache: Path) -> HostCalibration:
    return _session_calibration(kf_cache)


@pytest.fixture
def calibrated_now(kf_cache: Path) -> HostCalibration:
    """The session's calibration, fresh for the next minutes (measured again if the kept
    one ran out): a campaign the test starts finds it and spends none of its wall time
    calibrating, which holds the device, and so the verifier, for up to a minute on a
    busy host."""
    return _session_calibration(kf_cache)
