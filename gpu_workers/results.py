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
    forbidden_construct, forbidden_symbol, forbidden_instruction, kernel_state,
    load_time_code, executable_data, missing_entry_point; for cuda also
    signature_mismatch, bad_launch, launch_bounds, too_many_registers,
    shared_memory_exceeded, register_spill. run: crashed, timeout, memory_limit, exited,
    load_failed, forbidden_syscall (the kernel's process made a call a kernel may not),
    input_written (it stored into an input, read-only in its process), fp_state (it
    changed the floating-point control state), out_of_bounds_write, missing_result,
    launch_failed, bad_launch. compare: unwritten, non_finite, lost_non_finite (the
    reference's NaN or infinity not given), wrong_value, wrong_shape, input_modified,
    nondeterministic. benchmark: the run stage's endings, plus out_of_bounds_write,
    timing_stall, timing_inconsistent. recheck (every timed call on a few rows, timed calls
    chosen at random in full, and every distribution after timing): unwritten, non_finite,
    lost_non_finite, wrong_value, input_modified. roofline: beyond_roofline."""
    message: str
    """One line for a human."""
    evidence: dict[str, str] = msgspec.field(default_factory=dict)
    """Compiler log, first wrong index with expected and got, the signal, the trial, ..."""


class Mechanism(msgspec.Struct, frozen=True, kw_only=True):
    """One containment mechanism of the kernel's process: applied or not, and why."""

    name: str
    applied: bool
    note: str


class SandboxReport(msgspec.Struct, frozen=True, kw_only=True):
    """What isolation the host actually gave the child, stated honestly."""

    network_isolated: bool
    network_note: str
    cpu_seconds_limit: int
    address_space_limit_bytes: int
    """-1: not limited (a CUDA child maps far more virtual memory than it uses)."""
    wall_seconds_limit: float
    mechanisms: tuple[Mechanism, ...] = ()
    """How the kernel's own process was contained, mechanism by mechanism (CPU target)."""


class TrialReport(msgspec.Struct, frozen=True, kw_only=True):
    shape: dict[str, int]
    distribution: str
    seed: int
    max_rel_err: float
    """Largest |got - expected| / max(scale, atol / rtol) seen."""
    worst_output: str = ""
    """The element closest to failing (the largest share of its tolerance used): the
    output, its index, the values and the scale."""
    worst_index: tuple[int, ...] = ()
    worst_got: float = 0.0
    worst_expected: float = 0.0
    worst_scale: float = 0.0
    worst_used: float = 0.0
    """|got - expected| / (atol + rtol * scale) there: 1.0 is the limit."""


class WorstElement(msgspec.Struct, frozen=True, kw_only=True):
    """The element of a check closest to failing, or the worst failing one: where it is
    (trial shape, distribution, seed, output, index) and by how much."""

    shape: dict[str, int]
    distribution: str
    seed: int
    output: str
    index: tuple[int, ...]
    got: float
    expected: float
    error: float
    """|got - expected|."""
    scale: float
    """The magnitude the error is judged against (the problem's error scale there)."""
    allowed: float
    """atol + rtol * scale: the largest error that passes there."""
    used: float
    """error / allowed: below 1.0 passes; 1 - used is the margin."""


class Pace(msgspec.Struct, frozen=True, kw_only=True):
    """How fast a kernel's verification went: `seconds` for `work` units of cost
    (`gpu_workers.deadlines`)."""

    seconds: float
    work: float


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
    worst: WorstElement | None = None
    """Verified: the element closest to failing over every trial. Rejected for a wrong
    value: the worst wrong element. Otherwise None (the evidence names the first fault)."""
    compile_cache_hit: bool = False
    sandbox: SandboxReport | None = None
    seed: int | None = None
    """The check's seed: its shapes and every trial's inputs derive from it (replayable)."""
    pace: Pace | None = None
    """How fast the verified kernel's trials ran: what its timed calls' deadline derives from."""


class TimingStats(msgspec.Struct, frozen=True, kw_only=True):
    """One contender's timed calls. `mean_ns` is the figure it is ranked by: the mean over
    the timed calls, which moving work from one call to another cannot lower (a median
    can: heavy, light, light reads as light). The median and IQR describe the spread."""

    mean_ns: float
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


class HeadToHead(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A kernel against the incumbent in one interleaved run (two when the first left it in
    doubt): the kernel's time over the incumbent's, paired round by round."""

    ratio_median: float
    ratio_q1: float
    ratio_q3: float
    rounds: int
    remeasured: bool
    """The first run left it in doubt (a median ratio below 1, but the ratios straddled 1
    or the wins were too few to tell from chance): both were timed again and the rounds
    of the two runs pooled."""
    wins: int | None = None
    """Rounds the kernel won (ratio below 1); None in events recorded before it was kept."""
    ratio_of_means: float | None = None
    """The kernel's total time over the incumbent's in the same rounds: the ranking figure,
    which shifting work between calls cannot lower. `faster` requires it below 1 too."""
    faster: bool
    """The kernel beat the incumbent: its median ratio and its ratio of means are below 1
    and it won more rounds than equal speed would give but rarely
    (`gpu_workers.benchmarking.PROMOTION_ALPHA`)."""


class BenchmarkResult(msgspec.Struct, frozen=True, kw_only=True):
    problem: str
    target: str
    shape: dict[str, int]
    kernel: TimingStats
    baseline: TimingStats
    baseline_name: str
    incumbent: TimingStats | None
    speedup: float
    """baseline mean / kernel mean (`TimingStats.mean_ns`: the figure shifting cannot
    lower)."""
    speedup_vs_incumbent: float | None
    roofline_ns: float
    """The least time physics allows: max(bytes / bandwidth, flops / peak)."""
    roofline_fraction: float
    """roofline_ns / kernel mean (1.0 = at the ceiling)."""
    input_sets: int
    rotated_bytes: int
    timed_seconds: float
    caches_flushed: bool = False
    """True when every timed call's inputs and outputs were evicted from the caches before
    it (a GPU's L2, a CPU's every level); else the inputs rotated over `rotated_bytes`."""
    stall_retried: bool = False
    """True when a first timing run showed a stall and a fresh run did not."""
    host_contention_cores: float | None = None
    """Cores' worth of CPU the rest of the host used during the run (0 = quiet host)."""
    timing_attempts: int = 1
    """Timing runs made; a run on a busy host is repeated and the quietest one kept."""
    seed: int | None = None
    """The seed the timed and re-checked inputs derive from (replayable)."""
    attempt_seeds: tuple[int, ...] = ()
    """Every timing run's own seed, in order (the first is `seed`): each repeat drew new
    inputs and new judged calls."""
    judged_calls: tuple[int, ...] = ()
    """Which calls (counting warm-up) had their outputs judged, chosen at random."""
    rechecked: tuple[str, ...] = ()
    """The distributions re-checked at the timed shape, by the timed kernel, after timing."""
    handshake_ns: float | None = None
    """What one call's round trip costs with no kernel: part of every kernel sample."""
    kernel_cpu_seconds: float | None = None
    """CPU time the kernel's process used while warmed up and timed (all its threads)."""
    sandbox: SandboxReport | None = None
    head_to_head: HeadToHead | None = None
    """Whether it beat the incumbent, head to head (None without an incumbent)."""
