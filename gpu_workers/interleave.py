"""The timing loop every runner shares: the kernel, the baseline and the incumbent called
in turn on the same input set, warmed up first, the order rotated each round so no
contender always runs right after another (or always cold). The baseline, often many
times slower than the kernel and pooled over a whole campaign, may join only every n-th
round: its samples still spread evenly over the whole timed window (the CPU driver's
`BASELINE_EVERY`, 3, or `BASELINE_EVERY_WITH_INCUMBENT`, 6, in gpu_workers.cpu.protocol).

Against an incumbent the rounds are paired. When to stop is `gpu_workers.stopping`'s rule:
once the kernel's mean is known closely enough, or it has lost to the incumbent. A run
that stops with fewer than `MIN_BASELINE_CALLS` baseline calls then calls the baseline
alone until it has them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpu_workers.stopping import HALF_WIDTH, MAX_RUNS, Stopping, StoppingRule

Call = Callable[[int], int]
"""One timed call on input set `i`, returning its nanoseconds."""
MAX_WARMUP_CALLS = 10_000
MIN_BASELINE_CALLS = 5
"""A run that stops with fewer baseline calls (a head-to-head lost in 8 rounds had 2) calls
the baseline alone until it has these, unless it reached its time cap: a speedup over two
baseline calls, one of them slow, was twice what the kernel reproduced."""


@dataclass
class Samples:
    kernel_warmup_ns: list[int] = field(default_factory=list)
    kernel_ns: list[int] = field(default_factory=list)
    baseline_ns: list[int] = field(default_factory=list)
    incumbent_ns: list[int] = field(default_factory=list)
    timed_seconds: float = 0.0
    stopped: str = ""
    """Why the timed rounds ended (`gpu_workers.stopping.Stopping.reason`)."""


def interleave(
    kernel: Call,
    baseline: Call,
    incumbent: Call | None,
    input_sets: int,
    *,
    warmup: int,
    warmup_seconds: float,
    min_runs: int,
    min_seconds: float,
    max_seconds: float,
    progress: Callable[[str], None],
    baseline_every: int = 1,
    max_runs: int = MAX_RUNS,
    half_width: float | None = HALF_WIDTH,
) -> Samples:
    """Warm up (`warmup` calls and `warmup_seconds`; the baseline once), then time rounds
    until the stopping rule (`gpu_workers.stopping`) says so. The baseline is called in
    every `baseline_every`-th round (the first one included), and then alone until it has
    `MIN_BASELINE_CALLS` calls (the kernel is timed no further)."""
    samples = Samples()
    progress("warm-up")
    warm_started = time.perf_counter()
    while (
        len(samples.kernel_warmup_ns) < warmup
        or time.perf_counter() - warm_started < warmup_seconds
    ):
        i = len(samples.kernel_warmup_ns) % input_sets
        samples.kernel_warmup_ns.append(kernel(i))
        if len(samples.kernel_warmup_ns) == 1:
            baseline(i)
        if incumbent is not None:
            incumbent(i)
        if len(samples.kernel_warmup_ns) >= MAX_WARMUP_CALLS:
            break
    progress("timing")
    everyone = [(kernel, samples.kernel_ns), (baseline, samples.baseline_ns)]
    if incumbent is not None:
        everyone.append((incumbent, samples.incumbent_ns))
    without_baseline = [c for c in everyone if c[0] is not baseline]
    stopping = Stopping(StoppingRule(min_runs, min_seconds, max_runs, max_seconds, half_width))
    started = time.perf_counter()
    round_index = 0
    while True:
        elapsed = time.perf_counter() - started
        stopped = stopping.reason(elapsed, samples.kernel_ns, samples.incumbent_ns)
        if stopped is not None:
            samples.stopped = stopped
            break
        i = round_index % input_sets
        with_baseline = round_index % baseline_every == 0
        contenders = everyone if with_baseline else without_baseline
        turn = round_index // baseline_every if with_baseline else round_index
        first = turn % len(contenders)
        for slot in range(len(contenders)):
            call, into = contenders[(slot + first) % len(contenders)]
            into.append(call(i))
        stopping.add(samples.kernel_ns[-1], samples.incumbent_ns[-1] if incumbent else None)
        round_index += 1
    while samples.stopped != "max seconds" and len(samples.baseline_ns) < MIN_BASELINE_CALLS:
        samples.baseline_ns.append(baseline(len(samples.baseline_ns) % input_sets))
    samples.timed_seconds = time.perf_counter() - started
    return samples


@dataclass
class FieldSamples:
    """Every contender's timed calls, and the baseline's, of one N-way run."""

    contender_ns: list[list[int]]
    baseline_ns: list[int] = field(default_factory=list)
    rounds: int = 0
    timed_seconds: float = 0.0


def interleave_all(
    contenders: list[Call],
    baseline: Call,
    input_sets: int,
    *,
    warmup: int,
    rounds: int,
    max_seconds: float,
    progress: Callable[[str], None],
    baseline_every: int = 1,
) -> FieldSamples:
    """The head-to-head extended to N contenders, with no early stop: `warmup` calls of
    each (the baseline once), then rounds in which every contender is called once, the
    order rotated by one each round (the baseline, every `baseline_every`-th round, takes
    its turn in the rotation), until `rounds` are timed or `max_seconds` have passed
    with at least 3."""
    samples = FieldSamples(contender_ns=[[] for _ in contenders])
    progress("warm-up")
    baseline(0)
    for n in range(warmup):
        for call in contenders:
            call(n % input_sets)
    progress("timing")
    everyone = [*zip(contenders, samples.contender_ns, strict=True)]
    started = time.perf_counter()
    while samples.rounds < rounds:
        if time.perf_counter() - started >= max_seconds and samples.rounds >= 3:
            break
        i = samples.rounds % input_sets
        order = [*everyone]
        if samples.rounds % baseline_every == 0:
            order.append((baseline, samples.baseline_ns))
        first = samples.rounds % len(order)
        for call, into in order[first:] + order[:first]:
            into.append(call(i))
        samples.rounds += 1
    samples.timed_seconds = time.perf_counter() - started
    return samples
