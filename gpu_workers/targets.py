"""The map from a target name to its back end: one `Target` per device target, holding
every fact about it that differs from another target's (its back end, its calibration,
whether this host has its device, how its verification is split, its flags and sources).
Callers ask the map (`target_of(name).precheck`); none compares target names. Also the
calibration a worker keeps, and building and timing a kernel with a target's back end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, Generic

from gpu_workers.benchmarking import BenchmarkRequest, benchmark
from gpu_workers.calibration_cache import is_quiet
from gpu_workers.cpu.backend import VERIFY_LIMITS as CPU_VERIFY_LIMITS
from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.cpu.calibrate import CalibrationError as CpuCalibrationError
from gpu_workers.cpu.calibrate import cpu_model
from gpu_workers.cpu.calibrate import load_or_calibrate as calibrate_cpu
from gpu_workers.cpu.toolchain import default_cache_dir, nan_safe
from gpu_workers.cuda.backend import VERIFY_LIMITS as CUDA_VERIFY_LIMITS
from gpu_workers.cuda.backend import CudaBackend
from gpu_workers.cuda.calibrate import CalibrationError as GpuCalibrationError
from gpu_workers.cuda.calibrate import load_or_calibrate as calibrate_gpu
from gpu_workers.cuda.device import (
    benchmark_unavailable_reason,
    device_index,
    gpu_unavailable_reason,
    probe,
)
from gpu_workers.cuda.nvcc import default_cache_dir as cuda_cache_dir
from gpu_workers.protocols import Backend, BuildT
from gpu_workers.results import BenchmarkResult, HostCalibration, Rejection
from gpu_workers.sandbox import Limits
from kernels.design_space import TARGET_DTYPES
from kernels.spec import Problem


@dataclass(frozen=True)
class Target:
    """One device target: its back end, and what callers would otherwise learn by
    comparing its name."""

    name: str
    dtypes: tuple[str, ...]
    """The element types its templates are written for (`kernels.design_space`)."""
    backend: Callable[[], Backend[Any]]
    """The workers' back end: made once per process, long-lived."""
    checking_backend: Callable[[Limits], Backend[Any]]
    """A back end of its own for one check, verifying under the given limits."""
    probing_backend: Callable[[Limits], Backend[Any]]
    """A back end of its own for an agent's probes: its verification and timing runs both
    stay within the given limits."""
    verify_limits: Limits
    """What a kernel may use over a whole verification, unless told otherwise."""
    calibrate: Callable[..., HostCalibration]
    """Its `load_or_calibrate(force=...)`: the device's ceilings, cached or measured."""
    calibration_error: type[Exception]
    """What `calibrate` raises when the device cannot be measured."""
    precheck: bool
    """Its verification is split: compile and static on any host (the compiler role),
    the run on the device (a verifier there)."""
    missing: Callable[[], str | None]
    """Why this host cannot run its kernels; None: it can."""
    missing_for_timing: Callable[[], str | None]
    """Why this host cannot time its kernels against a calibrated roofline; None: it can."""
    device_index: Callable[[], str | None]
    """The device a worker on this host runs kernels on; None: the host's cores."""
    device_label: Callable[[], str]
    """The device a worker on this host uses, for its heartbeat."""
    default_flags: tuple[str, ...]
    """The compiler flags of a kernel that names none (`// kfactory-flags:`)."""
    built_flags: Callable[[tuple[str, ...]], tuple[str, ...]]
    """The flags its back end builds, verifies and times a kernel with, given the kernel's
    own: a file that hands the kernel on names these, so a plain compiler builds what was
    verified."""
    source_suffix: str
    """The file suffix of its kernel sources."""
    source_language: str
    """Its kernel sources' language, as Pygments names its lexer."""
    llm_brief: str | None
    """How its kernels are built and called, as the LLM writer's prompt says it; None:
    the LLM writer does not write its kernels yet."""
    takes_user_spaces: bool
    """The user's own spaces (seed kernels, a problem file's SPACES, a campaign's
    [[spaces]]: C sources, `kernels.user_spaces`) are searched for it."""


def _never_missing() -> str | None:
    return None


def _host_cores() -> str | None:
    return None


def _gpu_label() -> str:
    return f"{probe().name or 'cuda'} (GPU {device_index() or 0})"


@cache
def cpu_backend() -> CpuBackend:
    return CpuBackend(cache_dir=default_cache_dir(), recheck_pool=True)


@cache
def cuda_backend() -> CudaBackend:
    return CudaBackend(cache_dir=cuda_cache_dir())


CPU = Target(
    name="cpu",
    dtypes=TARGET_DTYPES["cpu"],
    backend=cpu_backend,
    checking_backend=lambda limits: CpuBackend(cache_dir=default_cache_dir(), verify_limits=limits),
    probing_backend=lambda limits: CpuBackend(
        cache_dir=default_cache_dir(), verify_limits=limits, bench_limits=limits
    ),
    verify_limits=CPU_VERIFY_LIMITS,
    calibrate=calibrate_cpu,
    calibration_error=CpuCalibrationError,
    precheck=False,
    missing=_never_missing,
    missing_for_timing=_never_missing,
    device_index=_host_cores,
    device_label=cpu_model,
    default_flags=("-O3", "-march=native", "-fopenmp"),
    built_flags=nan_safe,
    source_suffix=".c",
    source_language="c",
    llm_brief=(
        "Kernels are compiled as C11 by the system C compiler on x86-64 and called through "
        "ctypes.\nOpenMP, GCC vector extensions and <immintrin.h> intrinsics may be used; "
        "write portable fallbacks for intrinsics guarded by the CPU features they need."
    ),
    takes_user_spaces=True,
)
CUDA = Target(
    name="cuda",
    dtypes=TARGET_DTYPES["cuda"],
    backend=cuda_backend,
    checking_backend=lambda limits: CudaBackend(cache_dir=cuda_cache_dir(), verify_limits=limits),
    probing_backend=lambda limits: CudaBackend(
        cache_dir=cuda_cache_dir(), verify_limits=limits, bench_limits=limits
    ),
    verify_limits=CUDA_VERIFY_LIMITS,
    calibrate=calibrate_gpu,
    calibration_error=GpuCalibrationError,
    precheck=True,
    missing=gpu_unavailable_reason,
    missing_for_timing=benchmark_unavailable_reason,
    device_index=device_index,
    device_label=_gpu_label,
    default_flags=("-O3",),
    built_flags=tuple,
    source_suffix=".cu",
    source_language="cuda",
    llm_brief=None,
    takes_user_spaces=False,
)
TARGET_MAP: dict[str, Target] = {target.name: target for target in (CPU, CUDA)}
TARGETS = tuple(TARGET_MAP)

PRECHECKED_TARGETS = tuple(target.name for target in TARGET_MAP.values() if target.precheck)
"""Targets whose verification is split: compile and static here, the run on the device."""


class UnsupportedTarget(ValueError):
    """No back end serves this target."""


def target_of(name: str) -> Target:
    """The target called `name`; UnsupportedTarget if there is none."""
    try:
        return TARGET_MAP[name]
    except KeyError:
        raise UnsupportedTarget(f"unknown target {name!r}; known: {', '.join(TARGETS)}") from None


def worker_device_index(target: str) -> str | None:
    """The device a `target` worker on this host runs kernels on: None for cpu (the host's
    cores), the GPU (CUDA_VISIBLE_DEVICES' first) for cuda."""
    return target_of(target).device_index()


def device_missing(target: str, role: str | None = None) -> str | None:
    """Why this host cannot run `target` kernels (or, for the benchmarker, also time them
    against a calibrated roofline), or None when it can."""
    found = target_of(target)
    return found.missing_for_timing() if role == "benchmarker" else found.missing()


def backend_for(target: str) -> Backend[Any]:
    """The workers' back end of `target`."""
    return target_of(target).backend()


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


def _calibrate(target: str, *, force: bool) -> HostCalibration:
    return target_of(target).calibrate(force=force)


def _keep(target: str, calibration: HostCalibration) -> HostCalibration:
    _calibrations[target] = (
        calibration,
        math.inf if is_quiet(calibration) else time.monotonic() + CONTENDED_KEPT_SECONDS,
    )
    return calibration


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
    backend = backend_for(target)
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
