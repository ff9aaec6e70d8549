"""The plain-data results of verification, timing and calibration (frozen msgspec structs).

These are what actors turn into events; no behaviour lives here.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Stage = Literal["compile", "static", "run", "compare", "benchmark", "recheck", "roofline"]


class Rejection(msgspec.Struct, frozen=True, kw_only=True):
    """Why a kernel was refused: the stage, a short reason code, and the evidence."""

    stage: Stage
    reason: str
    """A stable code. compile: bad_flags, compile_error, compile_timeout, link_error,
    unsupported_dtype, no_compiler, bad_launch. static: forbidden_include,
    forbidden_construct, forbidden_symbol, missing_entry_point; for cuda also
    signature_mismatch, bad_launch, launch_bounds, too_many_registers,
    shared_memory_exceeded, register_spill. run: crashed, timeout, memory_limit, exited,
    out_of_bounds_write, missing_result, launch_failed, bad_launch. compare: unwritten,
    non_finite, wrong_value, wrong_shape, input_modified, nondeterministic. benchmark:
    crashed, timeout, memory_limit, exited, timing_stall, timing_inconsistent. recheck:
    unwritten, non_finite, wrong_value. roofline: beyond_roofline."""
    message: str
    """One line for a human."""
    evidence: dict[str, str] = msgspec.field(default_factory=dict)
    """Compiler log, first wrong index with expected and got, the signal, the trial, ..."""


class SandboxReport(msgspec.Struct, frozen=True, kw_only=True):
    """What isolation the host actually gave the child, stated honestly."""

    network_isolated: bool
    network_note: str
    cpu_seconds_limit: int
    address_space_limit_bytes: int
    """-1: not limited (a CUDA child maps far more virtual memory than it uses)."""
    wall_seconds_limit: float


class TrialReport(msgspec.Struct, frozen=True, kw_only=True):
    shape: dict[str, int]
    distribution: str
    seed: int
    max_rel_err: float
    """Largest |got - expected| / (atol + rtol * scale) seen, as a fraction of the tolerance."""


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of verification. `rejection` is None exactly when the kernel is verified."""

    problem: str
    target: str
    dtype: str
    source_sha256: str
    flags: tuple[str, ...]
    verified: bool
    rejection: Rejection | None = None
    trials: tuple[TrialReport, ...] = ()
    max_rel_err: float | None = None
    """Largest relative error over all trials, |got - expected| / scale."""
    compile_cache_hit: bool = False
    sandbox: SandboxReport | None = None


class TimingStats(msgspec.Struct, frozen=True, kw_only=True):
    median_ns: float
    q1_ns: float
    q3_ns: float
    iqr_ns: float
    min_ns: float
    max_ns: float
    runs: int


class HostCalibration(msgspec.Struct, frozen=True, kw_only=True):
    """The ceilings of this host: the roofline every CPU kernel is judged against."""

    host: str
    cpu_model: str
    cores: int
    llc_bytes: int
    memory_bandwidth_gbs: float
    """Read + write GB/s of an all-core copy with non-temporal stores (the fastest way)."""
    numpy_copy_bandwidth_gbs: float
    """Read + write GB/s of numpy's single-threaded copy, for comparison."""
    peak_fp32_gflops: float
    """The compute ceiling of the roofline: the higher of the two measurements below."""
    sgemm_gflops: float
    """A tuned BLAS sgemm on all cores (numpy float32 matmul)."""
    fma_peak_gflops: float
    """Independent FMA chains in the widest vectors on all cores; above sgemm when BLAS runs an
    older kernel than the CPU supports (e.g. OPENBLAS_CORETYPE=Haswell on an AVX-512 CPU)."""
    streaming_stores: bool
    measured_at: str
    method: str
    host_contention_cores: float | None = None
    """Cores' worth of CPU other work used while calibrating; high values mean low ceilings."""
    peak_gflops_by_dtype: dict[str, float] = {}
    """Compute ceilings of other element types (a GPU's tensor cores for bf16 and fp16);
    a dtype not named here is held to `peak_fp32_gflops`."""

    def peak_gflops(self, dtype: str) -> float:
        return self.peak_gflops_by_dtype.get(dtype, self.peak_fp32_gflops)


class BenchmarkResult(msgspec.Struct, frozen=True, kw_only=True):
    problem: str
    target: str
    shape: dict[str, int]
    kernel: TimingStats
    baseline: TimingStats
    baseline_name: str
    incumbent: TimingStats | None
    speedup: float
    """baseline median / kernel median."""
    speedup_vs_incumbent: float | None
    roofline_ns: float
    """The least time physics allows: max(bytes / bandwidth, flops / peak)."""
    roofline_fraction: float
    """roofline_ns / kernel median (1.0 = at the ceiling)."""
    input_sets: int
    rotated_bytes: int
    timed_seconds: float
    stall_retried: bool = False
    """True when a first timing run showed a stall and a fresh run did not."""
    host_contention_cores: float | None = None
    """Cores' worth of CPU the rest of the host used during the run (0 = quiet host)."""
    timing_attempts: int = 1
    """Timing runs made; a run on a busy host is repeated and the quietest one kept."""
