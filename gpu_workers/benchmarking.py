"""Timing rules, the same for every device.

The device back end times the kernel, the float32 numpy baseline and the incumbent
interleaved in one run, over input sets rotated across more memory than the last-level
cache, with fresh inputs before every timed call. The kernel is judged against the
incumbent round by round: it is faster only with more round wins than chance gives; one
that looks faster but is in doubt is timed against it again first. This module turns samples into
statistics and refuses what cannot be trusted: a stall in the timed region, samples that
add up to more than the run took, outputs of randomly chosen timed calls or of the
re-check after timing that are wrong (`judge_calls`), and a kernel faster than the
roofline allows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

from gpu_workers.pass_band import Band, within
from gpu_workers.results import (
    BenchmarkResult,
    HeadToHead,
    HostCalibration,
    Rejection,
    SandboxReport,
    TimingStats,
)
from gpu_workers.verification import DeviceBackend, bits, compare_outputs, new_seed, trial_seed
from kernels.spec import Arrays, Cost, Problem

MIN_RUNS = 30
MIN_SECONDS = 0.5
STALL_FACTOR = 20.0
STALL_MIN_EXCESS_NS = 100_000_000
ROOFLINE_SLACK = 1.10
"""A kernel may beat the calibrated ceiling by this factor (measurement noise) and no more."""
DISTINCT_INPUT_SETS = 2
QUIET_CORES = 0.25
"""A timing run during which other work used more CPU than this is repeated..."""
BUSY_RETRIES = 2
"""...up to this many times; the least disturbed run is kept, and its disturbance reported."""
PROMOTION_ALPHA = 0.05
"""A kernel beats the incumbent only with more round wins than two kernels of equal speed
(each round a fair coin) would give in more than this share of head-to-heads."""


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
        if call.bands is not None and all(
            within(call.outputs[a.name], call.bands[a.name], call.poison_bits)
            for a in problem.outputs
        ):
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


BuildT = TypeVar("BuildT")
BuildT_contra = TypeVar("BuildT_contra", contravariant=True)


class TimingBackend(Protocol[BuildT_contra]):
    target: str

    def time(
        self,
        problem: Problem,
        build: BuildT_contra,
        incumbent: BuildT_contra | None,
        shape: dict[str, int],
        *,
        seed: int,
        seeds: list[int],
        recheck_seed: int | None,
        rotate_bytes: int,
        min_runs: int,
        min_seconds: float,
        window_open: Callable[[], None] | None = None,
        window_closed: Callable[[], None] | None = None,
    ) -> TimingRun:
        """One timing run. `window_open`, if given, is called once the run is set up and
        before its warm-up, and returns when the device is held alone (a back end that
        cannot set up first calls it at once); `window_closed` once the run's timed window
        (warm-up and timed rounds) is over while it goes on (judging, re-check)."""
        ...


class TimingWindow(Protocol):
    """The device held alone for timing: `open` waits until it is (a no-op while it is),
    `close` lets other work on it again (a no-op when not held). A benchmark opens it
    when a timing run is set up (or before a calibration), and closes it as soon as the
    run's timed window is over."""

    def open(self) -> None: ...

    def close(self) -> None: ...


class NoWindow:
    """For callers that hold the device otherwise, or need not."""

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass


class Backend(DeviceBackend[BuildT], TimingBackend[BuildT], Protocol[BuildT]):
    """A back end that builds, verifies and times kernels of one build type."""


def timing_stats(samples: list[int]) -> TimingStats:
    if not samples:
        raise ValueError("no samples")
    q1, median, q3 = np.percentile(np.asarray(samples, dtype=np.float64), [25, 50, 75])
    return TimingStats(
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


def paired_ratios(run: TimingRun) -> list[float]:
    """The kernel's time over the incumbent's, round by round (they share each round)."""
    return [k / i for k, i in zip(run.kernel_ns, run.incumbent_ns, strict=False) if i > 0]


def wins_by_chance(wins: int, rounds: int) -> float:
    """How often two kernels of equal speed give at least `wins` of `rounds` to one of them:
    the one-sided sign test."""
    return sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2**rounds


def head_to_head(ratios: list[float], remeasured: bool) -> HeadToHead:
    q1, median, q3 = np.percentile(np.asarray(ratios, dtype=np.float64), [25, 50, 75])
    wins = sum(r < 1.0 for r in ratios)
    return HeadToHead(
        ratio_median=float(median),
        ratio_q1=float(q1),
        ratio_q3=float(q3),
        rounds=len(ratios),
        remeasured=remeasured,
        wins=wins,
        faster=bool(median < 1.0) and wins_by_chance(wins, len(ratios)) <= PROMOTION_ALPHA,
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
        return run.rejection
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


def benchmark(
    problem: Problem,
    backend: TimingBackend[BuildT],
    build: BuildT,
    calibration: HostCalibration,
    *,
    incumbent: BuildT | None = None,
    shape: dict[str, int] | None = None,
    dtype: str = "fp32",
    seed: int | None = None,
    min_runs: int = MIN_RUNS,
    min_seconds: float = MIN_SECONDS,
    recalibrate: Callable[[], HostCalibration] | None = None,
    window: TimingWindow | None = None,
) -> BenchmarkResult | Rejection:
    """Time a verified kernel against the baseline (and incumbent); re-check it afterwards.

    A kernel beyond the roofline is refused, but first, when `recalibrate` is given, the
    host is measured again: a ceiling measured on a busy host may simply be too low.
    `seed` (drawn afresh when None) is the check's secret: the timed inputs, which calls
    are judged and the re-check's inputs derive from it; it is recorded in the result.
    `window` is opened for every timing run once it is set up, and for a calibration, and
    closed as soon as each is past its timed window."""
    device = window or NoWindow()
    shape = problem.full_shape(shape or problem.default_shape)
    seed = new_seed() if seed is None else seed
    seeds = [trial_seed(seed, i, "bench") for i in range(DISTINCT_INPUT_SETS)]
    recheck_seed = trial_seed(seed, 0, "recheck")

    def time_once(recheck: bool = False) -> TimingRun:
        """One timing run; `recheck`: also re-check every distribution at this shape after
        timing (once per benchmark: repeats for a busy host or a stall only re-time; each
        still judges timed calls chosen at random)."""
        try:
            return backend.time(
                problem,
                build,
                incumbent,
                shape,
                seed=seed,
                seeds=seeds,
                recheck_seed=recheck_seed if recheck else None,
                rotate_bytes=2 * calibration.llc_bytes,
                min_runs=min_runs,
                min_seconds=min_seconds,
                window_open=device.open,
                window_closed=device.close,
            )
        finally:
            device.close()

    recalibrated = False

    def judge(run: TimingRun) -> Rejection | None:
        nonlocal calibration, recalibrated
        rejection = _judge(problem, run, shape, dtype, calibration)
        if rejection is None or rejection.reason != "beyond_roofline" or not recalibrate:
            return rejection
        if not recalibrated:
            device.open()
            try:
                calibration, recalibrated = recalibrate(), True
            finally:
                device.close()
        return _judge(problem, run, shape, dtype, calibration)

    run = time_once(recheck=True)
    rechecked = run.rechecked
    rejection = judge(run)
    if rejection is not None:
        return rejection
    attempts = 1
    while (run.host_contention_cores or 0.0) > QUIET_CORES and attempts <= BUSY_RETRIES:
        attempts += 1
        again = time_once()
        rejection = judge(again)
        if rejection is not None:
            return rejection
        if (again.host_contention_cores or 0.0) < (run.host_contention_cores or 0.0):
            run = again
    stall_retried = False
    first_stall = find_stall(run)
    if first_stall is not None:
        run = time_once()  # transient noise does not repeat in a fresh process; a cheat does
        rejection = judge(run)
        if rejection is not None:
            return rejection
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
        stall_retried = True
    versus = head_to_head(paired_ratios(run), remeasured=False) if run.incumbent_ns else None
    if versus is not None and in_doubt(versus):
        again = time_once()
        rejection = judge(again)
        if rejection is not None:
            return rejection
        versus = head_to_head(paired_ratios(run) + paired_ratios(again), remeasured=True)
        attempts += 1
    kernel = timing_stats(run.kernel_ns)
    baseline = timing_stats(run.baseline_ns)
    incumbent_stats = timing_stats(run.incumbent_ns) if run.incumbent_ns else None
    floor = roofline_ns(problem.cost_for(shape, dtype), calibration, dtype)
    return BenchmarkResult(
        problem=problem.name,
        target=backend.target,
        shape=shape,
        kernel=kernel,
        baseline=baseline,
        baseline_name=run.baseline_name,
        incumbent=incumbent_stats,
        speedup=baseline.median_ns / kernel.median_ns,
        speedup_vs_incumbent=(
            incumbent_stats.median_ns / kernel.median_ns if incumbent_stats else None
        ),
        roofline_ns=floor,
        roofline_fraction=floor / kernel.median_ns,
        input_sets=run.input_sets,
        rotated_bytes=run.rotated_bytes,
        caches_flushed=run.caches_flushed,
        timed_seconds=run.timed_seconds,
        stall_retried=stall_retried,
        host_contention_cores=run.host_contention_cores,
        timing_attempts=attempts,
        seed=seed,
        judged_calls=tuple(run.judged_calls),
        rechecked=tuple(rechecked),
        handshake_ns=run.handshake_ns,
        kernel_cpu_seconds=run.kernel_cpu_seconds,
        sandbox=run.sandbox,
        head_to_head=versus,
    )
