"""What a device back end is: the Protocols the cpu and cuda back ends implement
(`gpu_workers/cpu/backend.py`, `gpu_workers/cuda/backend.py`), and the plain data that
crosses between them and the device-independent rules (`gpu_workers.verification`,
`gpu_workers.benchmarking`): the trials asked for and the runs read back, the timing
request and the samples it comes to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from gpu_workers.pass_band import Band
from gpu_workers.results import Rejection, SandboxReport
from gpu_workers.stopping import HALF_WIDTH
from kernels.spec import Arrays, Problem

BuildT = TypeVar("BuildT")
"""A back end's build type (what its compile makes and its other stages take)."""


@dataclass(frozen=True)
class Trial:
    index: int
    shape: dict[str, int]
    distribution: str
    seed: int
    inputs: Arrays
    runs: int
    """How many times the kernel is called on these inputs."""


@dataclass(frozen=True)
class RunOutput:
    """What one kernel call left behind, as the device back end read it back."""

    trial: int
    run: int
    poison_bits: int
    outputs: Arrays
    inputs_after: Arrays
    damaged_slack: tuple[str, ...] = ()


@dataclass(frozen=True)
class CompileOutcome(Generic[BuildT]):
    build: BuildT | None
    rejection: Rejection | None
    cache_hit: bool = False


@dataclass
class RunOutcome:
    runs: list[RunOutput] = field(default_factory=list)
    rejection: Rejection | None = None
    sandbox: SandboxReport | None = None


@dataclass
class JudgedCall:
    """One kernel call whose outputs are judged: a timed call chosen at random, or a call of
    the re-check after timing."""

    when: str
    inputs: Arrays
    outputs: Arrays
    inputs_after: Arrays
    """The inputs as the call left them: they must be unchanged."""
    poison_bits: int
    seed: int | None
    """The seed `inputs` were drawn from, where they came from the problem's generator."""
    expected: Arrays | None = None
    scales: Arrays | None = None
    """The float64 reference of `inputs` and its error scale, where already computed (the
    re-check pool); None: computed here."""
    bands: dict[str, Band] | None = None
    """Each output's pass band for `expected` (`gpu_workers.pass_band`): outputs inside
    every band pass without the float64 comparison; any other goes to it."""


@dataclass
class TimingRun:
    """Raw samples of one timing run, as the device back end measured them."""

    kernel_ns: list[int] = field(default_factory=list)
    kernel_warmup_ns: list[int] = field(default_factory=list)
    baseline_ns: list[int] = field(default_factory=list)
    incumbent_ns: list[int] = field(default_factory=list)
    input_sets: int = 0
    rotated_bytes: int = 0
    caches_flushed: bool = False
    judged: list[JudgedCall] = field(default_factory=list)
    """Calls whose outputs the worker is to judge (a back end may judge them itself and
    report a `rejection` instead)."""
    judged_calls: list[int] = field(default_factory=list)
    """Which calls (counting warm-up) were judged."""
    rechecked: list[str] = field(default_factory=list)
    """The distributions re-checked at the timed shape after timing."""
    handshake_ns: float | None = None
    kernel_cpu_seconds: float | None = None
    sandbox: SandboxReport | None = None
    wall_seconds: float = 0.0
    timed_seconds: float = 0.0
    host_contention_cores: float | None = None
    baseline_name: str = "numpy float32"
    """What the baseline samples timed: the implementation users run today."""
    rejection: Rejection | None = None


@dataclass(frozen=True)
class TimingRequest(Generic[BuildT]):
    """One timing run, as the benchmark asks a back end for it."""

    problem: Problem
    build: BuildT
    incumbent: BuildT | None
    """Timed interleaved with the kernel, round by round; None: the kernel and the baseline."""
    shape: dict[str, int]
    seed: int
    """The check's secret: the fresh inputs and which calls are judged come from it."""
    seeds: tuple[int, ...]
    """One per input set the timed inputs are drawn from."""
    recheck_seed: int | None
    """Re-check every distribution at this shape after timing, on inputs from this seed;
    None: no re-check."""
    rotate_bytes: int
    """What a back end that cannot flush the caches writes between calls instead."""
    min_runs: int
    min_seconds: float
    half_width: float | None = HALF_WIDTH
    """Timing stops once the kernel's mean is known within this share (`gpu_workers.stopping`;
    None: after `min_runs` and `min_seconds`)."""
    window_open: Callable[[], None] | None = None
    """Called once the run is set up and before its warm-up; returns when the device is
    held alone (a back end that cannot set up first calls it at once)."""
    window_closed: Callable[[], None] | None = None
    """Called once the run's timed window (warm-up and timed rounds) is over while the run
    goes on (judging, re-check)."""
    call_seconds: float | None = None
    """How long one timed call may take (`gpu_workers.deadlines`); None: the back end's
    run limit only."""
    watch: Callable[[], None] | None = None
    """Called every few milliseconds while the run goes on; if it raises (the run went
    past its deadline, or its worker gave it up), the run's processes are killed and the
    error raised to the caller."""


@dataclass(frozen=True)
class FinalRequest(Generic[BuildT]):
    """The final run of a campaign: its top kernels timed together in one interleaved run
    (the head-to-head extended to N), the baseline as in a head-to-head. The inputs,
    cache flushes, rotated order and judged calls follow a timing run's rules; there is no
    re-check (each contender passed one when it was first timed) and no early stop."""

    problem: Problem
    builds: tuple[BuildT, ...]
    shape: dict[str, int]
    seed: int
    seeds: tuple[int, ...]
    rounds: int
    max_seconds: float
    """Timing ends after this long even short of `rounds` (with at least 3)."""
    rotate_bytes: int
    window_open: Callable[[], None] | None = None
    window_closed: Callable[[], None] | None = None
    call_seconds: float | None = None
    watch: Callable[[], None] | None = None


@dataclass
class FinalSamples:
    """What a final run measured: every contender's timed calls (in the request's order),
    the baseline's, and why each contender failed its judged calls, if it did."""

    contender_ns: list[list[int]] = field(default_factory=list)
    baseline_ns: list[int] = field(default_factory=list)
    failures: list[Rejection | None] = field(default_factory=list)
    rounds: int = 0
    timed_seconds: float = 0.0
    wall_seconds: float = 0.0
    host_contention_cores: float | None = None
    caches_flushed: bool = False
    baseline_name: str = "numpy float32"
    rejection: Rejection | None = None
    """The run as a whole could not be made (a back end that does not support it, a
    kernel that crashed)."""


class DeviceBackend(Protocol[BuildT]):
    """What a target must provide to be verified."""

    target: str

    def compile(
        self, problem: Problem, source: str, flags: tuple[str, ...], dtype: str
    ) -> CompileOutcome[BuildT]: ...

    def static_check(self, problem: Problem, build: BuildT) -> Rejection | None: ...

    def run_trials(self, problem: Problem, build: BuildT, trials: list[Trial]) -> RunOutcome: ...


class TimingBackend(Protocol[BuildT]):
    """What a target must provide to be timed."""

    target: str

    def time(self, request: TimingRequest[BuildT]) -> TimingRun:
        """One timing run, with its window callbacks called as `TimingRequest` says."""
        ...

    def time_final(self, request: FinalRequest[BuildT]) -> FinalSamples:
        """A final run, or a `FinalSamples` whose `rejection` says why not."""
        ...


class Backend(DeviceBackend[BuildT], TimingBackend[BuildT], Protocol[BuildT]):
    """A back end that builds, verifies and times kernels of one build type."""


class TimingWindow(Protocol):
    """The device held alone for timing: `open` waits until it is (a no-op while it is),
    `close` lets other work on it again (a no-op when not held). A benchmark opens it
    when a timing run is set up (or before a calibration), and closes it as soon as the
    run's timed window is over."""

    def open(self) -> None: ...

    def close(self) -> None: ...
