"""Timing rules, the same for every device.

The device back end times the kernel, the baseline and the incumbent interleaved in one
run (`gpu_workers.interleave`), warm-up first, then timed rounds until the 95% interval
of the kernel's mean is within `HALF_WIDTH` (2%) of it, after at least `MIN_RUNS` (10)
rounds and `MIN_SECONDS` (0.2 s), at most `MAX_RUNS` (100) rounds or `MAX_SECONDS` (3 s),
unless it has already lost to the incumbent (`gpu_workers.stopping`), over
`DISTINCT_INPUT_SETS` (2) input sets with fresh inputs before every timed call. Both
back ends evict every timed call's inputs and outputs from the caches before it (a
CPU's every level; a GPU's L2, by writing the request's `rotate_bytes`, twice the
last-level cache), and the result says so (`caches_flushed`). This module
turns samples into statistics and refuses what cannot be trusted. A kernel is ranked by
the mean over its timed calls (`TimingStats.mean_ns`; speedups, the roofline fraction
and the head-to-head are ratios of means): moving work from one call to another cannot
lower it, where a median reads heavy, light, light calls as light. The median and IQR
stay beside it as descriptive figures. Refused:
samples that add up to more than the run took (`timing_inconsistent`), outputs of
randomly chosen timed calls or of the re-check after timing that are wrong
(`judge_calls`), a stall (`find_stall`: a call, warm-up included, over `STALL_FACTOR`
(20) times the median and `STALL_MIN_EXCESS_NS` (100 ms) above it), and a median faster
than the roofline (bytes over the calibrated bandwidth, flops over the peak) by more
than `ROOFLINE_SLACK` (1.10). Before refusing a kernel beyond the roofline, the host is
measured again once, alone on the device (`BenchmarkRequest.recalibrate`): a ceiling
measured on a busy host may simply be too low.

Against the incumbent the kernel is compared round by round (paired ratios): it is
faster only when its mean time per round is below the incumbent's beyond chance (a
one-sided paired z-test at 5%, `faster_on_average`), its median ratio is below 1 and its
round wins pass a one-sided sign test at `PROMOTION_ALPHA` (5%), so that of kernels
equal to the best, one in twenty at most is promoted (`head_to_head`). One that looks
faster but is in doubt (`in_doubt`: the ratios' IQR straddles 1, or too few wins) is
timed against it again and the rounds of both runs are pooled before it is decided.

A run that cannot be taken as it is gets timed again by a named retry policy
(`RETRY_POLICIES`, in this order): a busy host (other work used more than `QUIET_CORES`
(0.25) cores during the run) is timed again up to `BUSY_RETRIES` (2) times, so up to 3
runs, the least disturbed one kept; a stall is timed once more in a fresh process and
refused (`timing_stall`) if it stalls again; a head-to-head in doubt is pooled as above.
The result records the attempts (`timing_attempts`), whether a stall was retried
(`stall_retried`) and the kept run's contention (`host_contention_cores`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic

import numpy as np

from gpu_workers.deadlines import at_shape
from gpu_workers.pass_band import within
from gpu_workers.protocols import (
    BuildT,
    JudgedCall,
    TimingBackend,
    TimingRequest,
    TimingRun,
    TimingWindow,
)
from gpu_workers.quick_compare import every_element_passes
from gpu_workers.results import BenchmarkResult, HeadToHead, HostCalibration, Rejection, TimingStats
from gpu_workers.sampled_rows import judged_in_row_blocks, passes_in_row_blocks
from gpu_workers.stopping import (
    HALF_WIDTH,
    MEAN_Z,
    MIN_RUNS,
    MIN_SECONDS,
    PROMOTION_ALPHA,
    wins_by_chance,
)
from gpu_workers.verification import bits, compare_outputs, new_seed, trial_seed
from kernels.spec import Cost, Problem, Tolerance

STALL_FACTOR = 20.0
STALL_MIN_EXCESS_NS = 100_000_000
ROOFLINE_SLACK = 1.10
"""A kernel may beat the calibrated ceiling by this factor (measurement noise) and no more."""
DISTINCT_INPUT_SETS = 2
QUIET_CORES = 0.25
"""A timing run during which other work used more CPU than this is repeated..."""
BUSY_RETRIES = 2
"""...up to this many times; the least disturbed run is kept, and its disturbance reported."""


def judge_calls(problem: Problem, dtype: str, calls: list[JudgedCall]) -> Rejection | None:
    """Every element of every judged call against the float64 reference; inputs unchanged."""
    tolerance = problem.tolerances[dtype]
    for call in calls:
        context = {"when": call.when}
        if call.seed is not None:
            context["seed"] = str(call.seed)
        for arg in problem.inputs:
            changed = np.flatnonzero(
                bits(call.inputs[arg.name].reshape(-1))
                != bits(call.inputs_after[arg.name].reshape(-1))
            )
            if changed.size:
                return Rejection(
                    stage="recheck",
                    reason="input_modified",
                    message=f"input {arg.name} changed during {call.when} "
                    f"({changed.size} elements)",
                    evidence={**context, "input": arg.name, "first_flat_index": str(changed[0])},
                )
        if _every_element_passes(problem, tolerance, call):
            continue
        rejection, _ = compare_outputs(
            problem,
            tolerance,
            call.inputs,
            call.outputs,
            call.poison_bits,
            stage="recheck",
            context=context,
            expected=call.expected,
            scales=call.scales,
        )
        if rejection is not None:
            return rejection
    return None


def passes_on_bands(problem: Problem, call: JudgedCall) -> bool:
    """True when `call` passes `judge_calls` on its pass bands alone (`gpu_workers.pass_band`):
    its inputs unchanged and every output inside its band. No reference and no copy is made,
    so a timing run can judge a re-check call on the arena itself, between timed calls. False
    says nothing: `judge_calls` decides."""
    return (
        call.bands is not None
        and all(
            np.array_equal(
                bits(call.inputs[a.name].reshape(-1)), bits(call.inputs_after[a.name].reshape(-1))
            )
            for a in problem.inputs
        )
        and all(
            within(call.outputs[a.name], call.bands[a.name], call.poison_bits)
            for a in problem.outputs
        )
    )


def _every_element_passes(problem: Problem, tolerance: Tolerance, call: JudgedCall) -> bool:
    """The verdict alone, the cheapest way there is: by the pass bands a re-check set keeps,
    in blocks of rows, or whole; `compare_outputs` then names a failure."""
    if call.bands is not None and all(
        within(call.outputs[a.name], call.bands[a.name], call.poison_bits) for a in problem.outputs
    ):
        return True
    if call.expected is None and judged_in_row_blocks(problem):
        return passes_in_row_blocks(problem, tolerance, call.inputs, call.outputs, call.poison_bits)
    expected = problem.expected(call.inputs) if call.expected is None else call.expected
    scales = problem.scales(call.inputs, expected) if call.scales is None else call.scales
    return all(
        call.outputs[a.name].shape == np.shape(expected[a.name])
        and every_element_passes(
            call.outputs[a.name], expected[a.name], scales[a.name], call.poison_bits, tolerance
        )
        for a in problem.outputs
    )


class NoWindow:
    """For callers that hold the device otherwise, or need not."""

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass


def timing_stats(samples: list[int]) -> TimingStats:
    if not samples:
        raise ValueError("no samples")
    values = np.asarray(samples, dtype=np.float64)
    q1, median, q3 = np.percentile(values, [25, 50, 75])
    return TimingStats(
        mean_ns=float(values.mean()),
        median_ns=float(median),
        q1_ns=float(q1),
        q3_ns=float(q3),
        iqr_ns=float(q3 - q1),
        min_ns=float(min(samples)),
        max_ns=float(max(samples)),
        runs=len(samples),
    )


def roofline_ns(cost: Cost, calibration: HostCalibration, dtype: str = "fp32") -> float:
    """The least time this host allows: memory traffic at full bandwidth or flops at peak."""
    memory = cost.bytes_moved / (calibration.memory_bandwidth_gbs * 1e9)
    compute = cost.flops / (calibration.peak_gflops(dtype) * 1e9)
    return max(memory, compute) * 1e9


def paired_rounds(runs: Sequence[TimingRun]) -> list[tuple[int, int]]:
    """(kernel ns, incumbent ns) of every round both were timed in."""
    return [(k, i) for run in runs for k, i in zip(run.kernel_ns, run.incumbent_ns, strict=False)]


def faster_on_average(pairs: Sequence[tuple[int, int]]) -> tuple[float | None, bool]:
    """The ratio of the kernel's total time to the incumbent's over `pairs`, and whether
    the kernel's mean is below the incumbent's by more than chance (a paired z-test)."""
    incumbent = sum(i for _, i in pairs)
    if incumbent <= 0 or len(pairs) < 2:
        return None, False
    differences = np.asarray([k - i for k, i in pairs], dtype=np.float64)
    error = float(differences.std(ddof=1)) / math.sqrt(len(pairs))
    mean = float(differences.mean())
    return sum(k for k, _ in pairs) / incumbent, mean < 0 and mean < -MEAN_Z * error


def head_to_head(pairs: Sequence[tuple[int, int]], remeasured: bool) -> HeadToHead:
    """The kernel against the incumbent over the rounds' (kernel ns, incumbent ns) `pairs`,
    round by round and by the ranking figure: a kernel whose mean time is not below the
    incumbent's beyond chance is not faster, however many rounds it won (heavy, light,
    light calls win two rounds in three)."""
    ratios = [k / i for k, i in pairs if i > 0]
    q1, median, q3 = np.percentile(np.asarray(ratios, dtype=np.float64), [25, 50, 75])
    wins = sum(r < 1.0 for r in ratios)
    of_means, on_average = faster_on_average(pairs)
    return HeadToHead(
        ratio_median=float(median),
        ratio_q1=float(q1),
        ratio_q3=float(q3),
        rounds=len(ratios),
        remeasured=remeasured,
        wins=wins,
        faster=bool(median < 1.0)
        and on_average
        and wins_by_chance(wins, len(ratios)) <= PROMOTION_ALPHA,
        ratio_of_means=of_means,
    )


def within_noise(versus: HeadToHead) -> bool:
    """Neither is faster in most rounds: the IQR of the paired ratios straddles 1."""
    return versus.ratio_q1 <= 1.0 <= versus.ratio_q3


def in_doubt(versus: HeadToHead) -> bool:
    """The kernel looks faster (median ratio below 1), but within noise or by too few wins
    to tell from chance: both are timed again before it counts either way."""
    return versus.ratio_median < 1.0 and (within_noise(versus) or not versus.faster)


def find_stall(run: TimingRun) -> dict[str, str] | None:
    """A call far slower than the median, anywhere from the first warm-up call on."""
    median = float(np.median(run.kernel_ns))
    calls = [*run.kernel_warmup_ns, *run.kernel_ns]
    for index, ns in enumerate(calls):
        if ns > STALL_FACTOR * median and ns - median > STALL_MIN_EXCESS_NS:
            return {
                "call": str(index),
                "call_ns": str(ns),
                "median_ns": f"{median:.0f}",
                "warm_up_calls": str(len(run.kernel_warmup_ns)),
                "rule": (
                    f"> {STALL_FACTOR:g} x median and > {STALL_MIN_EXCESS_NS / 1e6:g} ms over it"
                ),
            }
    return None


def _judge(
    problem: Problem,
    run: TimingRun,
    shape: dict[str, int],
    dtype: str,
    calibration: HostCalibration,
) -> Rejection | None:
    """Everything but stalls: the run finished, its samples are consistent, the judged calls
    are right, and it is no faster than the roofline."""
    if run.rejection is not None:
        return at_shape(run.rejection, shape)
    reported = sum(run.kernel_ns) + sum(run.kernel_warmup_ns)
    if reported > run.wall_seconds * 1e9:
        return Rejection(
            stage="benchmark",
            reason="timing_inconsistent",
            message="the kernel's samples add up to more time than the whole run took",
            evidence={"samples_ns": str(reported), "wall_ns": f"{run.wall_seconds * 1e9:.0f}"},
        )
    rejection = judge_calls(problem, dtype, run.judged)
    if rejection is not None:
        return rejection
    median = float(np.median(run.kernel_ns))
    floor = roofline_ns(problem.cost_for(shape, dtype), calibration, dtype)
    if median * ROOFLINE_SLACK < floor:
        return Rejection(
            stage="roofline",
            reason="beyond_roofline",
            message=(
                f"median {median:.0f} ns is faster than the {floor:.0f} ns this host "
                "physically allows"
            ),
            evidence={
                "median_ns": f"{median:.0f}",
                "roofline_ns": f"{floor:.0f}",
                "bandwidth_gbs": f"{calibration.memory_bandwidth_gbs:.1f}",
                "peak_gflops": f"{calibration.peak_gflops(dtype):.1f}",
                "slack": str(ROOFLINE_SLACK),
            },
        )
    return None


def attempt_seed(seed: int, attempt: int) -> int:
    """Timing run `attempt`'s own secret, from the check's: the first run's is the check's
    seed itself; a repeat (a busy host, a stall, a head-to-head in doubt) draws new inputs
    and new judged calls, and replays from the recorded seed alone."""
    return seed if attempt == 0 else trial_seed(seed, attempt, "attempt")


@dataclass(frozen=True)
class BenchmarkRequest(Generic[BuildT]):
    """A verified kernel to time against the baseline (and the incumbent), and how.

    `seed` (drawn afresh when None) is the check's secret: every timing run's own seed
    derives from it (`attempt_seed`), and from that its timed inputs, which calls are judged
    and the re-check's inputs; the result records every run's seed.
    A kernel beyond the roofline is refused, but first, when `recalibrate` is given, the
    host is measured again: a ceiling measured on a busy host may simply be too low.
    `window` is opened for every timing run once it is set up, and for a calibration, and
    closed as soon as each is past its timed window."""

    problem: Problem
    backend: TimingBackend[BuildT]
    build: BuildT
    calibration: HostCalibration
    incumbent: BuildT | None = None
    shape: dict[str, int] | None = None
    """None: the problem's default shape."""
    dtype: str = "fp32"
    seed: int | None = None
    min_runs: int = MIN_RUNS
    min_seconds: float = MIN_SECONDS
    half_width: float | None = HALF_WIDTH
    """The stopping rule's interval (`gpu_workers.stopping`); None: a fixed count."""
    recalibrate: Callable[[], HostCalibration] | None = None
    window: TimingWindow | None = None
    watch: Callable[[], None] | None = None
    """Passed to every timing run (`TimingRequest.watch`): raising stops the run."""
    call_seconds: float | None = None
    """How long one timed call may take (`TimingRequest.call_seconds`)."""


class TimingSession(Generic[BuildT]):
    """The timing runs of one benchmark: each in a window of its own, each judged against
    the calibration, which is measured again (once) before a run beyond the roofline is
    refused."""

    def __init__(self, request: BenchmarkRequest[BuildT]) -> None:
        self.request = request
        self.window = request.window or NoWindow()
        self.shape = request.problem.full_shape(request.shape or request.problem.default_shape)
        self.seed = new_seed() if request.seed is None else request.seed
        self.attempt_seeds: list[int] = []
        """Every timing run's seed, in order: a repeat never sees the same evidence again."""
        self.calibration = request.calibration
        self.recalibrated = False

    def time(self, recheck: bool = False) -> TimingRun:
        """One timing run; `recheck`: also re-check every distribution at this shape after
        timing (once per benchmark: the retry policies' runs only re-time; each still
        judges timed calls chosen at random)."""
        request = self.request
        seed = attempt_seed(self.seed, len(self.attempt_seeds))
        self.attempt_seeds.append(seed)
        try:
            return request.backend.time(
                TimingRequest(
                    problem=request.problem,
                    build=request.build,
                    incumbent=request.incumbent,
                    shape=self.shape,
                    seed=seed,
                    seeds=tuple(trial_seed(seed, i, "bench") for i in range(DISTINCT_INPUT_SETS)),
                    recheck_seed=trial_seed(seed, 0, "recheck") if recheck else None,
                    rotate_bytes=2 * self.calibration.llc_bytes,
                    min_runs=request.min_runs,
                    min_seconds=request.min_seconds,
                    half_width=request.half_width,
                    window_open=self.window.open,
                    window_closed=self.window.close,
                    watch=request.watch,
                    call_seconds=request.call_seconds,
                )
            )
        finally:
            self.window.close()

    def judge(self, run: TimingRun) -> Rejection | None:
        """`_judge`; a run beyond the roofline is judged again after the host is
        recalibrated (alone on the device), where the request allows it."""
        problem, dtype = self.request.problem, self.request.dtype
        rejection = _judge(problem, run, self.shape, dtype, self.calibration)
        recalibrate = self.request.recalibrate
        if rejection is None or rejection.reason != "beyond_roofline" or not recalibrate:
            return rejection
        if not self.recalibrated:
            self.window.open()
            try:
                self.calibration, self.recalibrated = recalibrate(), True
            finally:
                self.window.close()
        return _judge(problem, run, self.shape, dtype, self.calibration)

    def judged_run(self, recheck: bool = False) -> TimingRun | Rejection:
        """One timing run (`time`), or why it was refused (`judge`)."""
        run = self.time(recheck)
        rejection = self.judge(run)
        return run if rejection is None else rejection


@dataclass(frozen=True)
class Measured:
    """Where a benchmark stands between its retry policies."""

    run: TimingRun
    """The run whose times are reported."""
    rechecked: list[str]
    """The distributions the first run re-checked after timing."""
    attempts: int = 1
    """The timing runs counted (a stall's fresh run replaces one, and is not counted)."""
    stall_retried: bool = False
    pooled: tuple[TimingRun, ...] = ()
    """Further runs whose rounds against the incumbent count with `run`'s."""


def versus_incumbent(measured: Measured) -> HeadToHead | None:
    """The kernel against the incumbent over every pooled round; None: timed without one."""
    if not measured.run.incumbent_ns:
        return None
    runs = (measured.run, *measured.pooled)
    return head_to_head(paired_rounds(runs), remeasured=bool(measured.pooled))


def _contention(run: TimingRun) -> float:
    return run.host_contention_cores or 0.0


def retime_while_busy(session: TimingSession[Any], measured: Measured) -> Measured | Rejection:
    """A busy host: while other work used more than QUIET_CORES during the kept run, time
    again, up to BUSY_RETRIES times; the least disturbed run is kept."""
    run, attempts = measured.run, measured.attempts
    while _contention(run) > QUIET_CORES and attempts <= BUSY_RETRIES:
        attempts += 1
        again = session.judged_run()
        if isinstance(again, Rejection):
            return again
        if _contention(again) < _contention(run):
            run = again
    return dataclasses.replace(measured, run=run, attempts=attempts)


def retime_a_stall(session: TimingSession[Any], measured: Measured) -> Measured | Rejection:
    """A stall (`find_stall`): time once more, in a fresh process. Transient noise does
    not repeat there; a cheat does, and a stall in both runs is refused."""
    first_stall = find_stall(measured.run)
    if first_stall is None:
        return measured
    run = session.judged_run()
    if isinstance(run, Rejection):
        return run
    stall = find_stall(run)
    if stall is not None:
        return Rejection(
            stage="benchmark",
            reason="timing_stall",
            message=(
                f"call {stall['call']} took {int(stall['call_ns']) / 1e6:.1f} ms against a "
                f"median of {float(stall['median_ns']) / 1e6:.3f} ms, in two fresh runs"
            ),
            evidence={
                **stall,
                "first_run_call": first_stall["call"],
                "first_run_call_ns": first_stall["call_ns"],
            },
        )
    return dataclasses.replace(measured, run=run, stall_retried=True)


def pool_a_head_to_head_in_doubt(
    session: TimingSession[Any], measured: Measured
) -> Measured | Rejection:
    """A head-to-head in doubt (`in_doubt`): time the kernel against the incumbent again
    and pool the rounds of both runs."""
    versus = versus_incumbent(measured)
    if versus is None or not in_doubt(versus):
        return measured
    again = session.judged_run()
    if isinstance(again, Rejection):
        return again
    return dataclasses.replace(measured, pooled=(again,), attempts=measured.attempts + 1)


RetryPolicy = Callable[[TimingSession[Any], Measured], Measured | Rejection]
RETRY_POLICIES: tuple[RetryPolicy, ...] = (
    retime_while_busy,
    retime_a_stall,
    pool_a_head_to_head_in_doubt,
)
"""Applied in this order to every benchmark; the first rejection ends it."""


def benchmark(request: BenchmarkRequest[BuildT]) -> BenchmarkResult | Rejection:
    """Time a verified kernel against the baseline (and incumbent), re-checking it after
    the first run, then time again where a retry policy says so (`RETRY_POLICIES`)."""
    session = TimingSession(request)
    first = session.judged_run(recheck=True)
    if isinstance(first, Rejection):
        return first
    measured = Measured(run=first, rechecked=first.rechecked)
    for policy in RETRY_POLICIES:
        outcome = policy(session, measured)
        if isinstance(outcome, Rejection):
            return outcome
        measured = outcome
    return _result(session, measured)


def _result(session: TimingSession[Any], measured: Measured) -> BenchmarkResult:
    request, run, shape = session.request, measured.run, session.shape
    kernel = timing_stats(run.kernel_ns)
    baseline = timing_stats(run.baseline_ns)
    incumbent = timing_stats(run.incumbent_ns) if run.incumbent_ns else None
    floor = roofline_ns(
        request.problem.cost_for(shape, request.dtype), session.calibration, request.dtype
    )
    return BenchmarkResult(
        problem=request.problem.name,
        target=request.backend.target,
        shape=shape,
        kernel=kernel,
        baseline=baseline,
        baseline_name=run.baseline_name,
        incumbent=incumbent,
        speedup=baseline.mean_ns / kernel.mean_ns,
        speedup_vs_incumbent=incumbent.mean_ns / kernel.mean_ns if incumbent else None,
        roofline_ns=floor,
        roofline_fraction=floor / kernel.mean_ns,
        input_sets=run.input_sets,
        rotated_bytes=run.rotated_bytes,
        caches_flushed=run.caches_flushed,
        timed_seconds=run.timed_seconds,
        stall_retried=measured.stall_retried,
        host_contention_cores=run.host_contention_cores,
        timing_attempts=measured.attempts,
        seed=session.seed,
        attempt_seeds=tuple(session.attempt_seeds),
        judged_calls=tuple(run.judged_calls),
        rechecked=tuple(measured.rechecked),
        handshake_ns=run.handshake_ns,
        kernel_cpu_seconds=run.kernel_cpu_seconds,
        sandbox=run.sandbox,
        head_to_head=versus_incumbent(measured),
    )
