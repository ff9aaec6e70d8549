"""Messages between the worker and its sandboxed CPU driver (files in the sandbox dir).

The file names, RunRecord and VerifyReply are every runner's: gpu_workers.runner_files.
The driver never loads a kernel: it starts a kernel host for it (kernel_process.py).
"""

from __future__ import annotations

import msgspec

from gpu_workers.results import Mechanism, Rejection
from gpu_workers.runner_files import VerifyReply
from gpu_workers.stopping import HALF_WIDTH, MAX_RUNS, MAX_SECONDS, MIN_RUNS, MIN_SECONDS

POISON_BITS = (0x7FBADBAD, 0xFFC0FFEE)
"""Output poison per run: two different NaN payloads, so 'unwritten' is recognisable."""


class KernelHostJob(msgspec.Struct, frozen=True, kw_only=True):
    """How to start the kernel's process, and what it may use over the whole run."""

    host: str
    """The kernel host program (gpu_workers/cpu/kernel_host.c, built by the worker)."""
    address_space_bytes: int
    cpu_seconds: int
    wall_seconds: float
    """Wall-clock time the kernel's calls may take in all (loading included)."""
    call_seconds: float | None = None
    """Wall-clock time one call may take (`gpu_workers.deadlines`); None: only the above."""


class TrialJob(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    shape: dict[str, int]
    distribution: str
    seed: int
    arg_shapes: list[list[int]]
    dims: list[int]
    """Dimension values in signature order."""
    runs: int


class VerifyJob(msgspec.Struct, frozen=True, kw_only=True, tag="verify"):
    library: str
    kernel_host: KernelHostJob
    arg_names: list[str]
    outputs: list[bool]
    trials: list[TrialJob]
    layout_seed: int
    """Where in their pages the buffers of each trial start (drawn per check)."""


BASELINE_EVERY = 3
"""The baseline is timed in every n-th round (still over the whole window): at 10 rounds
it gets 4 samples, and the campaign pools every candidate's."""
BASELINE_EVERY_WITH_INCUMBENT = 6
"""Once the campaign has a best (the incumbent), its pooled baseline has samples already:
the baseline joins every n-th round (2 samples at 10 rounds)."""


class BenchJob(msgspec.Struct, frozen=True, kw_only=True, tag="bench"):
    library: str
    incumbent_library: str | None
    kernel_host: KernelHostJob
    fresh_inputs_library: str | None
    """The fast generator of fresh timing inputs; None: the problem's own generator."""
    cache_flush_library: str
    """Evicts a call's inputs and outputs from every cache level before it is timed."""
    problem: str
    dtype: str
    shape: dict[str, int]
    seed: int
    """The check's secret: fresh inputs, which calls are judged, buffer placement."""
    seeds: list[int]
    """The baseline's input sets."""
    recheck_seed: int | None
    """Re-check every distribution at this shape after timing, from this seed (None: not
    in this run)."""
    recheck_pool: str | None = None
    """The worker's secret pool of re-check inputs with their references
    (`gpu_workers.recheck_pool`); None: drawn and referenced afresh in this run."""
    judged_calls: int = 3
    """How many kernel calls (warm-up included), chosen at random, have their outputs
    judged."""
    warmup: int = 3
    warmup_seconds: float = 0.3
    min_runs: int = MIN_RUNS
    min_seconds: float = MIN_SECONDS
    max_runs: int = MAX_RUNS
    max_seconds: float = MAX_SECONDS
    half_width: float | None = HALF_WIDTH
    """The stopping rule (`gpu_workers.stopping`): timing stops once the 95% interval of the
    kernel's mean is within this share of it (None: after `min_runs` and `min_seconds`)."""
    baseline_every: int = BASELINE_EVERY
    baseline_every_with_incumbent: int = BASELINE_EVERY_WITH_INCUMBENT
    wait_for_window: bool = False
    """Set up (kernels loaded, inputs written), then wait until the caller holds the
    device alone for the run (`runner_files.wait_for_window`) before warming up."""


class FinalJob(BenchJob, frozen=True, kw_only=True, tag="final"):
    """A final run: every library in `libraries` timed in one interleaved run, with the
    settings of a timing run (`library` is the first of them; `min_runs` the rounds)."""

    libraries: list[str]


class CalibrateJob(msgspec.Struct, frozen=True, kw_only=True, tag="calibrate"):
    library: str
    copy_bytes: int
    sgemm_n: int
    fma_iterations: int


Job = VerifyJob | BenchJob | FinalJob | CalibrateJob


class BenchReply(msgspec.Struct, frozen=True, kw_only=True, tag="bench"):
    kernel_ns: list[int]
    kernel_warmup_ns: list[int]
    baseline_ns: list[int]
    incumbent_ns: list[int]
    input_sets: int
    rotated_bytes: int
    timed_seconds: float
    rejection: Rejection | None
    """Why the kernel failed while timed or re-checked (judged by the driver, which holds
    the inputs and outputs), or None."""
    judged_calls: list[int]
    """Which calls (counting warm-up) had their outputs judged."""
    rechecked: list[str]
    """The distributions re-checked at the timed shape after timing."""
    handshake_ns: float
    """Median cost of one call round trip with no kernel: included in every kernel time."""
    kernel_cpu_seconds: float
    """CPU time the kernel's process used over warm-up and timing (all its threads)."""
    mechanisms: list[Mechanism]
    stopped: str = ""
    """Why the timed rounds ended (`gpu_workers.stopping.Stopping.reason`)."""
    window_contention_cores: float | None = None
    """Cores' worth of CPU time used during the timed window (warm-up and timed rounds) by
    other processes and by the driver's own threads while a contender's call was timed, if
    /proc/stat could be read."""


class CalibrateReply(msgspec.Struct, frozen=True, kw_only=True, tag="calibrate"):
    copy_seconds: float
    copy_bytes: int
    numpy_copy_seconds: float
    sgemm_seconds: float
    sgemm_n: int
    fma_seconds: float
    fma_flops: float
    streaming_stores: bool


class FinalReply(msgspec.Struct, frozen=True, kw_only=True, tag="final"):
    contender_ns: list[list[int]]
    """Each library's timed calls, in the job's order."""
    baseline_ns: list[int]
    rounds: int
    timed_seconds: float
    failures: list[Rejection | None]
    """Why each library's judged calls failed, or None."""
    rejection: Rejection | None
    """The run could not be finished (a kernel ended, or wrote out of bounds)."""
    mechanisms: list[Mechanism]
    window_contention_cores: float | None = None


Reply = VerifyReply | BenchReply | FinalReply | CalibrateReply
