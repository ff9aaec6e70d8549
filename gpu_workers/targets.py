"""The device back end for a campaign target, shared by the compiler, verifier and
benchmarker; and whether this host has the device at all."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import cache
from typing import Any, Generic

from gpu_workers.benchmarking import BenchmarkRequest, benchmark
from gpu_workers.calibration_cache import is_quiet
from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.cpu.build import default_cache_dir
from gpu_workers.cpu.calibrate import load_or_calibrate as calibrate_cpu
from gpu_workers.cuda.backend import CudaBackend
from gpu_workers.cuda.calibrate import load_or_calibrate as calibrate_gpu
from gpu_workers.cuda.device import (
    benchmark_unavailable_reason,
    device_index,
    gpu_unavailable_reason,
)
from gpu_workers.cuda.nvcc import default_cache_dir as cuda_cache_dir
from gpu_workers.protocols import Backend, BuildT
from gpu_workers.results import BenchmarkResult, HostCalibration, Rejection
from kernels.design_space import TARGET_DTYPES
from kernels.spec import Problem

TARGETS = tuple(TARGET_DTYPES)

PRECHECKED_TARGETS = ("cuda",)
"""Targets whose verification is split: compile and static here, the run on the device."""


def worker_device_index(target: str) -> str | None:
    """The device a `target` worker on this host runs kernels on: None for cpu (the host's
    cores), the GPU (CUDA_VISIBLE_DEVICES' first) for cuda."""
    return device_index() if target == "cuda" else None


class UnsupportedTarget(ValueError):
    """No back end serves this target."""


def device_missing(target: str, role: str | None = None) -> str | None:
    """Why this host cannot run `target` kernels (or, for the benchmarker, also time them
    against a calibrated roofline), or None when it can."""
    check_target(target)
    if target != "cuda":
        return None
    return benchmark_unavailable_reason() if role == "benchmarker" else gpu_unavailable_reason()


def check_target(target: str) -> None:
    if target not in TARGETS:
        raise UnsupportedTarget(f"unknown target {target!r}; known: {', '.join(TARGETS)}")


@cache
def backend_for(target: str) -> CpuBackend | CudaBackend:
    check_target(target)
    return cuda_backend() if target == "cuda" else cpu_backend()


@cache
def cpu_backend() -> CpuBackend:
    return CpuBackend(cache_dir=default_cache_dir(), recheck_pool=True)


@cache
def cuda_backend() -> CudaBackend:
    return CudaBackend(cache_dir=cuda_cache_dir())


CONTENDED_KEPT_SECONDS = 300.0
"""How long this process keeps using a calibration measured on a busy host before it
measures again (a quiet one is kept for good)."""
_calibrations: dict[str, tuple[HostCalibration, float]] = {}


def calibration_for(target: str) -> HostCalibration:
    """The device's ceilings: a quiet measurement for good, a contended one for a while."""
    if calibration_kept(target):
        return _calibrations[target][0]
    return _keep(target, _calibrate(target, force=False))


def calibration_kept(target: str) -> bool:
    """`calibration_for` answers without measuring the device."""
    kept = _calibrations.get(target)
    return kept is not None and time.monotonic() < kept[1]


def recalibrate(target: str) -> HostCalibration:
    """Measure the device again, never reading the cache (a ceiling measured while it was
    busy can be too low); the new figures replace the cached ones only if the host was
    quiet while they were measured."""
    return _keep(target, _calibrate(target, force=True))


def _keep(target: str, calibration: HostCalibration) -> HostCalibration:
    _calibrations[target] = (
        calibration,
        math.inf if is_quiet(calibration) else time.monotonic() + CONTENDED_KEPT_SECONDS,
    )
    return calibration


def _calibrate(target: str, *, force: bool) -> HostCalibration:
    check_target(target)
    if target == "cuda":
        return calibrate_gpu(force=force)
    return calibrate_cpu(force=force)


Timed = BenchmarkResult | Rejection
"""What timing a kernel comes to: its times, or why it was refused."""


@dataclass(frozen=True)
class TimingBuilds(Generic[BuildT]):
    """A kernel (and the incumbent it is timed against) built by one back end, ready to
    be timed there; the build type never leaves that back end."""

    backend: Backend[BuildT]
    build: BuildT
    incumbent: BuildT | None

    def time(self, problem: Problem, calibration: HostCalibration, **options: Any) -> Timed:
        """Time the build (`gpu_workers.benchmarking.benchmark`; `options` are the rest
        of its `BenchmarkRequest`)."""
        return benchmark(
            BenchmarkRequest(
                problem, self.backend, self.build, calibration, incumbent=self.incumbent, **options
            )
        )


def build_for_timing(
    target: str,
    problem: Problem,
    source: str,
    flags: tuple[str, ...],
    dtype: str,
    *,
    incumbent: tuple[str, tuple[str, ...]] | None = None,
) -> TimingBuilds[Any] | Rejection:
    """Build the kernel (and the incumbent, a (source, flags) pair) with the target's back
    end; a kernel that does not build is the compile stage's rejection, with the
    compiler's message and log. An incumbent that no longer builds is left out."""
    check_target(target)
    backend: Backend[Any] = cuda_backend() if target == "cuda" else cpu_backend()
    compiled = backend.compile(problem, source, flags, dtype)
    if compiled.build is None:
        assert compiled.rejection is not None
        return compiled.rejection
    incumbent_build = None
    if incumbent is not None:
        incumbent_build = backend.compile(problem, incumbent[0], incumbent[1], dtype).build
    return TimingBuilds(backend, compiled.build, incumbent_build)


def compile_and_time(
    target: str,
    problem: Problem,
    source: str,
    flags: tuple[str, ...],
    dtype: str,
    *,
    incumbent: tuple[str, tuple[str, ...]] | None = None,
    calibration: HostCalibration,
    **options: Any,
) -> Timed:
    """Build (`build_for_timing`) and time, in one call."""
    builds = build_for_timing(target, problem, source, flags, dtype, incumbent=incumbent)
    if isinstance(builds, Rejection):
        return builds
    return builds.time(problem, calibration, dtype=dtype, **options)
