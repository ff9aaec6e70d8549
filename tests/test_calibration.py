"""Ceilings that are true: a host is calibrated only when it is quiet; a measurement taken
while other work ran is marked and kept for a few minutes only; and
recalibrating measures afresh instead of reading the cache. The contention is real: CPU
burning processes on every core while the calibration runs."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest

from gpu_workers import targets
from gpu_workers.calibration_cache import (
    CONTENDED_KEPT_SECONDS,
    QUIET_CORES,
    cached_calibration,
    contended_path,
    is_quiet,
)
from gpu_workers.cpu import calibrate
from gpu_workers.cpu.calibrate import CalibrationSizes, calibration_path, load_or_calibrate
from gpu_workers.results import HostCalibration

SMALL = CalibrationSizes(copy_bytes=16 << 20, sgemm_n=256, fma_iterations=1_000_000)
"""Sizes that keep a calibration run to seconds (the ceilings are not judged here)."""


@contextmanager
def burning_every_core() -> Iterator[None]:
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        time.sleep(0.5)
        yield
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


def _planted(path: Path, *, busy: float | None) -> HostCalibration:
    """A calibration file written by hand, so that reading it back is unmistakable."""
    planted = HostCalibration(
        host="planted",
        cpu_model="planted",
        cores=1,
        llc_bytes=1 << 20,
        memory_bandwidth_gbs=0.001,
        numpy_copy_bandwidth_gbs=0.001,
        peak_fp32_gflops=0.001,
        sgemm_gflops=0.001,
        fma_peak_gflops=0.001,
        streaming_stores=True,
        measured_at="2000-01-01T00:00:00+00:00",
        method="planted",
        host_contention_cores=busy,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(msgspec.json.encode(planted))
    return planted


def test_a_contended_measurement_is_marked_and_kept_for_minutes_only(tmp_path: Path) -> None:
    with burning_every_core():
        busy = load_or_calibrate(tmp_path, attempts=2, backoff_s=0.1, sizes=SMALL)
    assert busy.host_contention_cores is not None
    assert busy.host_contention_cores > QUIET_CORES
    assert not is_quiet(busy)
    assert "contended" in busy.method and "kept for minutes only" in busy.method
    assert not calibration_path(tmp_path).exists()
    beside = contended_path(calibration_path(tmp_path))
    # every process of the next minutes reads it back instead of measuring again
    assert load_or_calibrate(tmp_path, attempts=1, sizes=SMALL) == busy
    expired = time.time() - CONTENDED_KEPT_SECONDS - 1
    os.utime(beside, (expired, expired))
    assert load_or_calibrate(tmp_path, attempts=1, sizes=SMALL).measured_at != busy.measured_at


def test_only_a_quiet_calibration_is_read_back_and_force_measures_afresh(tmp_path: Path) -> None:
    path = calibration_path(tmp_path)
    quiet = _planted(path, busy=0.0)
    assert load_or_calibrate(tmp_path) == quiet  # read back, not measured
    fresh = load_or_calibrate(tmp_path, force=True, attempts=1, sizes=SMALL)
    assert fresh.measured_at != quiet.measured_at and fresh.host != "planted"
    # a file holding a contended measurement (as older versions wrote) is not trusted
    _planted(path, busy=1.5)
    again = load_or_calibrate(tmp_path, attempts=1, sizes=SMALL)
    assert again.host != "planted"
    kept = path.read_bytes()
    assert (b'"host":"planted"' in kept) is not is_quiet(again)


@pytest.mark.slow
def test_recalibrate_measures_afresh_rather_than_reading_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KFACTORY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibrate, "ATTEMPTS", 1)
    planted = _planted(calibration_path(None), busy=0.0)
    monkeypatch.setattr(targets, "_calibrations", {})
    assert targets.calibration_for("cpu") == planted
    fresh = targets.recalibrate("cpu")
    assert fresh.host != "planted" and fresh.measured_at != planted.measured_at
    assert fresh.host_contention_cores is not None
    assert targets.calibration_for("cpu") == fresh  # what was measured last is what is used


def test_a_contended_calibration_is_used_for_a_while_then_measured_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    measured: list[HostCalibration] = []

    def measure(target: str, *, force: bool) -> HostCalibration:
        busy = _planted(Path(tempfile.mkdtemp()) / "c.json", busy=1.5)
        measured.append(busy)
        return busy

    monkeypatch.setattr(targets, "_calibrations", {})
    monkeypatch.setattr(targets, "_calibrate", measure)
    first = targets.calibration_for("cpu")
    assert targets.calibration_for("cpu") is first and len(measured) == 1
    monkeypatch.setattr(targets, "CONTENDED_KEPT_SECONDS", 0.0)
    targets.recalibrate("cpu")
    targets.calibration_for("cpu")
    assert len(measured) == 3


def test_a_quiet_measurement_taken_again_keeps_each_ceiling_s_higher_value(
    tmp_path: Path,
) -> None:
    """A host quiet by CPU time can still be short of memory bandwidth (another guest on
    the machine): the calibration that read low is not kept for good once a quiet
    measurement reads higher, and a lower one never replaces a ceiling."""
    path = calibration_path(tmp_path)
    first = msgspec.structs.replace(
        _planted(path, busy=0.0), memory_bandwidth_gbs=40.0, fma_peak_gflops=200.0
    )
    path.write_bytes(msgspec.json.encode(first))
    second = msgspec.structs.replace(
        first, memory_bandwidth_gbs=60.0, fma_peak_gflops=150.0, measured_at="later"
    )
    merged = cached_calibration(path, lambda: second, force=True)
    assert (merged.memory_bandwidth_gbs, merged.fma_peak_gflops) == (60.0, 200.0)
    assert merged.measured_at == "later" and first.measured_at in merged.method
    assert msgspec.json.decode(path.read_bytes(), type=HostCalibration) == merged
    busy = msgspec.structs.replace(second, memory_bandwidth_gbs=90.0, host_contention_cores=1.5)
    assert cached_calibration(path, lambda: busy, force=True) == busy
    assert load_or_calibrate(tmp_path) == merged  # a busy host's reading replaced nothing
