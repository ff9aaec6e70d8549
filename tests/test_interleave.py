"""The shared timing loop: who is called, in what order, and when it stops."""

from __future__ import annotations

from collections.abc import Callable

from gpu_workers.interleave import MIN_BASELINE_CALLS, interleave
from gpu_workers.stopping import LOSS_RATIO, LOSS_ROUNDS


def recorded(calls: list[tuple[str, int]], name: str, ns: int) -> Callable[[int], int]:
    """A contender that takes `ns` a call and records its name and input set in `calls`."""

    def call(i: int) -> int:
        calls.append((name, i))
        return ns

    return call


def test_contenders_take_turns_on_each_input_set_and_rotate_who_goes_first() -> None:
    calls: list[tuple[str, int]] = []
    stages: list[str] = []
    samples = interleave(
        recorded(calls, "kernel", 1),
        recorded(calls, "baseline", 2),
        recorded(calls, "incumbent", 3),
        2,
        warmup=2,
        warmup_seconds=0.0,
        min_runs=6,
        min_seconds=0.0,
        max_seconds=60.0,
        progress=stages.append,
    )
    assert stages == ["warm-up", "timing"]
    assert samples.kernel_warmup_ns == [1, 1]
    assert (samples.kernel_ns, samples.baseline_ns, samples.incumbent_ns) == (
        [1] * 6,
        [2] * 6,
        [3] * 6,
    )
    warm_up = ["kernel", "baseline", "incumbent", "kernel", "incumbent"]
    assert [name for name, _ in calls[:5]] == warm_up  # the baseline warmed up once
    timed = calls[5:]
    rounds = [timed[k : k + 3] for k in range(0, len(timed), 3)]
    assert [r[0][0] for r in rounds[:3]] == ["kernel", "baseline", "incumbent"]
    assert all(len({i for _, i in r}) == 1 for r in rounds)  # one input set per round
    assert [r[0][1] for r in rounds] == [0, 1, 0, 1, 0, 1]


def test_without_an_incumbent_it_stops_at_the_time_cap_after_three_runs() -> None:
    samples = interleave(
        lambda i: 5,
        lambda i: 7,
        None,
        1,
        warmup=1,
        warmup_seconds=0.0,
        min_runs=10**9,
        min_seconds=0.0,
        max_seconds=0.0,
        progress=lambda _: None,
    )
    assert len(samples.kernel_ns) == 3 and samples.incumbent_ns == []
    assert samples.baseline_ns == [7, 7, 7]


def test_the_baseline_joins_every_nth_round_spread_over_the_whole_window() -> None:
    log: list[tuple[str, int]] = []
    samples = interleave(
        recorded(log, "kernel", 1),
        recorded(log, "baseline", 1),
        recorded(log, "incumbent", 2),  # the kernel wins every round
        1,
        warmup=3,
        warmup_seconds=0.0,
        min_runs=15,
        min_seconds=0.0,
        max_seconds=60.0,
        progress=lambda _: None,
        baseline_every=3,
    )
    calls = [name for name, _ in log]
    assert len(samples.kernel_ns) == len(samples.incumbent_ns) == 15
    assert len(samples.baseline_ns) == 5 == MIN_BASELINE_CALLS
    warm, timed = calls[:7], calls[7:]  # three warm-up rounds, the baseline in the first
    assert warm.count("baseline") == 1 and warm.count("kernel") == 3
    rounds, current = [], []
    for name in timed:
        current.append(name)
        if len(current) == (3 if len(rounds) % 3 == 0 else 2):
            rounds.append(current)
            current = []
    assert ["baseline" in r for r in rounds] == [True, False, False] * 5
    assert {r[0] for r in rounds} == {"kernel", "baseline", "incumbent"}  # order rotates


def _rounds(kernel: list[int], incumbent: list[int], min_runs: int = 30) -> int:
    """How many timed rounds a kernel with these times (cycled) gets against the incumbent."""
    k, i = iter(kernel * min_runs), iter(incumbent * min_runs)
    samples = interleave(
        lambda _: next(k),
        lambda _: 1,
        lambda _: next(i),
        2,
        warmup=0,
        warmup_seconds=0.0,
        min_runs=min_runs,
        min_seconds=0.0,
        max_seconds=60.0,
        progress=lambda _: None,
    )
    assert len(samples.kernel_ns) == len(samples.incumbent_ns)
    return len(samples.kernel_ns)


def test_a_kernel_that_lost_every_early_round_by_the_margin_stops_there() -> None:
    slow = int(LOSS_RATIO * 100) + 1
    assert _rounds([slow], [100]) == LOSS_ROUNDS
    assert _rounds([10 * slow], [100]) == LOSS_ROUNDS


def test_a_kernel_that_can_still_win_is_timed_until_its_mean_is_known() -> None:
    assert _rounds([90], [100]) == 30  # the kernel wins: tight at once, 30 the minimum here
    assert _rounds([101, 99], [100]) == 30  # 15 losses of 30: the median may be below 1


def test_without_an_incumbent_nothing_is_lost() -> None:
    samples = interleave(
        lambda _: 10**9,
        lambda _: 1,
        None,
        1,
        warmup=0,
        warmup_seconds=0.0,
        min_runs=12,
        min_seconds=0.0,
        max_seconds=60.0,
        progress=lambda _: None,
    )
    assert len(samples.kernel_ns) == 12


def test_a_run_that_stops_early_still_times_the_baseline_enough_calls() -> None:
    """A kernel that lost at once, with the baseline in every 6th round: the kernel and
    the incumbent are timed no further, and the baseline alone until it has
    MIN_BASELINE_CALLS calls."""
    log: list[tuple[str, int]] = []
    samples = interleave(
        recorded(log, "kernel", int(LOSS_RATIO * 100) + 1),
        recorded(log, "baseline", 1000),
        recorded(log, "incumbent", 100),
        2,
        warmup=0,
        warmup_seconds=0.0,
        min_runs=30,
        min_seconds=0.0,
        max_seconds=60.0,
        progress=lambda _: None,
        baseline_every=6,
    )
    assert samples.stopped == "lost"
    assert len(samples.kernel_ns) == len(samples.incumbent_ns) == LOSS_ROUNDS
    assert len(samples.baseline_ns) == MIN_BASELINE_CALLS
    calls = [name for name, _ in log]
    added = MIN_BASELINE_CALLS - -(-LOSS_ROUNDS // 6)  # beyond every 6th round's
    assert calls[-added:] == ["baseline"] * added and calls[-added - 1] != "baseline"
