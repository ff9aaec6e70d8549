"""The stopping rule of a timing run, on synthetic sample sequences: no host timing."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from gpu_workers.interleave import interleave
from gpu_workers.stopping import (
    HALF_WIDTH,
    LOSS_RATIO,
    LOSS_ROUNDS,
    PROMOTION_ALPHA,
    PROVE_RUNS,
    RunningMean,
    Stopping,
    StoppingRule,
    faster_beyond_chance,
    t_quantile_975,
    wins_by_chance,
)


def _run(
    kernel: list[int], incumbent: list[int] | None = None, **rule: float | int | None
) -> tuple[int, str]:
    """(rounds, reason) of a run of these kernel (and incumbent) times, cycled, with the
    clock standing still at 0 s past the start (`min_seconds` 0 unless given)."""
    stopping = Stopping(StoppingRule(**{"min_seconds": 0.0, **rule}))  # type: ignore[arg-type]
    kernel_ns: list[int] = []
    incumbent_ns: list[int] = []
    ks = itertools.cycle(kernel)
    incs = itertools.cycle(incumbent) if incumbent else None
    while (reason := stopping.reason(0.0, kernel_ns, incumbent_ns)) is None:
        kernel_ns.append(next(ks))
        if incs is not None:
            incumbent_ns.append(next(incs))
        stopping.add(kernel_ns[-1], incumbent_ns[-1] if incs is not None else None)
    return len(kernel_ns), reason


def _first_tight(samples: list[int], min_runs: int) -> int:
    """The first count from `min_runs` on whose 95% t-interval of the mean is within
    HALF_WIDTH, computed from scratch with the statistics module."""
    for n in itertools.count(min_runs):
        window = samples[:n]
        half = t_quantile_975(n - 1) * statistics.stdev(window) / math.sqrt(n)
        if half <= HALF_WIDTH * statistics.fmean(window):
            return n
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    ("degrees", "exact"),
    [(1, 12.706), (9, 2.262), (10, 2.228), (15, 2.131), (20, 2.086), (30, 2.042), (120, 1.980)],
)
def test_the_t_quantile_matches_the_table(degrees: int, exact: float) -> None:
    assert t_quantile_975(degrees) == pytest.approx(exact, abs=1.5e-3)


def test_the_running_interval_is_the_textbook_one() -> None:
    values = [1000, 1300, 900, 1100, 1250, 980, 1010, 1500, 870, 1190, 1040]
    running = RunningMean()
    for v in values:
        running.add(v)
    assert running.mean == pytest.approx(statistics.fmean(values))
    half = t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    assert running.half_width() == pytest.approx(half)


def test_a_tight_sequence_stops_at_the_minimum() -> None:
    assert _run([1000, 1003, 998, 1001], min_runs=10) == (10, "settled")
    assert _run([7] * 3, min_runs=4) == (4, "settled")


def test_a_spread_sequence_runs_until_its_interval_is_tight() -> None:
    spread = [1000, 1150, 880, 1210, 930, 1060, 790, 1120]  # about 13% of the mean
    rounds, reason = _run(spread, min_runs=10, max_runs=1000)
    assert reason == "settled"
    assert rounds == _first_tight(spread * 200, 10)
    assert rounds > 10


def test_a_sequence_that_never_tightens_stops_at_max_runs() -> None:
    assert _run([100, 1000], min_runs=10, max_runs=40) == (40, "max runs")


def test_a_run_stops_at_max_seconds_with_three_rounds_at_least() -> None:
    stopping = Stopping(StoppingRule(min_runs=10, min_seconds=0.2, max_seconds=5.0))
    samples = [100, 1000]
    for ns in samples:
        stopping.add(ns, None)
    assert stopping.reason(6.0, samples, []) is None  # two rounds: a third first
    stopping.add(100, None)
    samples.append(100)
    assert stopping.reason(4.9, samples, []) is None
    assert stopping.reason(5.0, samples, []) == "max seconds"


def test_nothing_stops_before_min_seconds_but_the_cap() -> None:
    stopping = Stopping(StoppingRule(min_runs=3, min_seconds=0.2, max_seconds=5.0))
    samples = [100] * 20
    for ns in samples:
        stopping.add(ns, None)
    assert stopping.reason(0.1, samples, []) is None
    assert stopping.reason(0.2, samples, []) == "settled"


def test_without_an_interval_the_count_is_fixed() -> None:
    assert _run([100, 1000], min_runs=12, half_width=None) == (12, "fixed count")


def test_a_kernel_that_lost_every_early_round_by_the_margin_stops_there() -> None:
    slow = int(LOSS_RATIO * 100) + 1
    assert _run([slow, 5 * slow], [100], min_runs=30) == (LOSS_ROUNDS, "lost")


def test_a_spread_kernel_slower_on_average_beyond_chance_stops_at_the_minimum() -> None:
    # never 1.25x slower in every round, never tight, but slower on average: it can be
    # neither promoted nor in doubt
    assert _run([150, 100, 120, 180, 95], [100], min_runs=10) == (10, "slower")


def test_a_spread_kernel_that_may_still_win_is_timed_on() -> None:
    faster = _run([60, 100, 80, 130, 70], [100], min_runs=10, max_runs=60)
    assert faster == (60, "max runs")
    tied = _run([150, 50, 120, 80], [100], min_runs=10, max_runs=60)
    assert tied == (60, "max runs")


def test_the_timing_loop_stops_where_the_rule_says() -> None:
    spread = [1000, 1080, 940, 1050, 960]  # about 5% of the mean
    kernel = itertools.cycle(spread)
    samples = interleave(
        lambda _: next(kernel),
        lambda _: 1,
        None,
        2,
        warmup=0,
        warmup_seconds=0.0,
        min_runs=10,
        min_seconds=0.0,
        max_seconds=60.0,
        progress=lambda _: None,
    )
    assert samples.stopped == "settled"
    assert len(samples.kernel_ns) == _first_tight(spread * 200, 10)


def test_a_tight_kernel_faster_on_average_is_timed_until_a_promotion_could_say_so() -> None:
    kernel = [99, 98, 97, 101, 96]  # tight, and faster on average, winning 4 rounds in 5
    assert _run(kernel, min_runs=10) == (10, "settled")  # alone, its mean is known at once
    rounds, reason = _run(kernel, [100], min_runs=10)
    assert reason == "settled" and 10 < rounds < PROVE_RUNS
    differences = RunningMean()
    wins = 0
    for k in itertools.islice(itertools.cycle(kernel), rounds):
        differences.add(k - 100)
        wins += k < 100
    assert faster_beyond_chance(differences, wins)
    assert wins_by_chance(wins, rounds) <= PROMOTION_ALPHA


def test_a_kernel_that_cannot_prove_itself_stops_at_the_old_count() -> None:
    # faster on average, winning 3 rounds in 5: the sign test would need about 70 rounds
    assert _run([99, 100, 98, 101, 97], [100], min_runs=10) == (PROVE_RUNS, "settled")


def test_a_kernel_clearly_faster_stops_at_the_minimum() -> None:
    assert _run([90, 91, 89], [100], min_runs=10) == (10, "settled")


def test_a_kernel_no_faster_on_average_is_not_timed_on_to_prove_itself() -> None:
    assert _run([100, 101, 99], [100], min_runs=12) == (12, "settled")
