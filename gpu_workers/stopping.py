"""When a timing run has enough rounds: the stopping rule the shared timing loop
(`gpu_workers.interleave`) asks after every round.

A kernel is ranked by its mean time over the timed calls (`gpu_workers.benchmarking`), so
the run stops once that mean is known closely enough: the 95% confidence interval of the
mean (Student's t-interval over the kernel's timed calls) is within `HALF_WIDTH` (2%) of
the mean on either side, after at least `min_runs` rounds and `min_seconds`. A kernel
whose calls spread widely gets more rounds, up to `max_runs` rounds (once `min_seconds`
have passed) or `max_seconds`, whichever comes first (never fewer than 3 rounds).

Against an incumbent it also stops, after `min_seconds`, once the kernel has lost the
head-to-head: it was slower by `LOSS_RATIO` (1.25x) in each of at least `LOSS_ROUNDS` (8)
rounds (`lost`), or its mean time per round is above the incumbent's beyond chance, after
at least `min_runs` paired rounds (`slower_beyond_chance`: the one-sided paired z-test at
5% that promotion uses the other way round), so it could be neither promoted nor in doubt.

The interval's running sums are kept as the samples come (`RunningMean`), so a kernel of a
few microseconds, timed thousands of times, pays nothing per round for the rule."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

HALF_WIDTH = 0.02
"""The 95% interval of the kernel's mean, relative to the mean, within which timing stops."""
MIN_RUNS = 10
"""Rounds before the interval is trusted: fewer, and its own spread estimate is too rough."""
MAX_RUNS = 100
"""Rounds after which a kernel whose interval never tightens stops anyway (once
`min_seconds` have passed): its mean is then known to about 1.96 / 10 of its spread."""
MIN_SECONDS = 0.2
MAX_SECONDS = 10.0
LOSS_ROUNDS = 8
LOSS_RATIO = 1.25
"""A kernel slower than the incumbent by this factor in each of the first `LOSS_ROUNDS`
paired rounds has lost the head-to-head: the median of its paired ratios is at least this
factor, and more rounds are not needed to say so."""
SLOWER_Z = 1.645
"""One-sided 5%: how many standard errors the kernel's mean time per round must be above
the incumbent's for the run to stop as lost."""


def t_quantile_975(degrees: int) -> float:
    """Student's t at 97.5% for `degrees` degrees of freedom: exact below 10 (from the
    table), Cornish-Fisher's expansion from 10 on (within 0.001 of the exact value)."""
    table = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262)
    if degrees < 1:
        return math.inf
    if degrees <= len(table):
        return table[degrees - 1]
    z, v = 1.959964, float(degrees)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


class RunningMean:
    """The mean of the samples so far and its 95% t-interval, from running sums (Welford)."""

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self._squares = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self._squares += delta * (value - self.mean)

    def half_width(self) -> float:
        """Half the 95% interval of the mean (infinite below 2 samples)."""
        if self.count < 2:
            return math.inf
        spread = math.sqrt(max(0.0, self._squares) / (self.count - 1))
        return t_quantile_975(self.count - 1) * spread / math.sqrt(self.count)

    def within(self, relative: float) -> bool:
        """The interval lies within `relative` of the mean on either side."""
        return self.mean > 0 and self.half_width() <= relative * self.mean


def lost(kernel_ns: Sequence[int], incumbent_ns: Sequence[int]) -> bool:
    """Every paired round so far, at least `LOSS_ROUNDS` of them, went to the incumbent by
    `LOSS_RATIO` or more."""
    rounds = list(zip(kernel_ns, incumbent_ns, strict=False))
    return len(rounds) >= LOSS_ROUNDS and all(k >= LOSS_RATIO * i for k, i in rounds)


def slower_beyond_chance(differences: RunningMean) -> bool:
    """The kernel's mean time per round (`differences`: kernel ns less incumbent ns, round by
    round) is above the incumbent's by more than `SLOWER_Z` standard errors."""
    if differences.count < 2:
        return False
    error = differences.half_width() / t_quantile_975(differences.count - 1)
    return differences.mean > 0 and differences.mean > SLOWER_Z * error


@dataclass(frozen=True)
class StoppingRule:
    """How many rounds a timing run takes (see the module's docstring). `half_width` None:
    a fixed count, `min_runs` rounds and `min_seconds` (probes, and callers that want it)."""

    min_runs: int = MIN_RUNS
    min_seconds: float = MIN_SECONDS
    max_runs: int = MAX_RUNS
    max_seconds: float = MAX_SECONDS
    half_width: float | None = HALF_WIDTH


class Stopping:
    """The rule applied to one run's samples as they come: `add` each round's times, then
    ask `reason` whether to stop."""

    def __init__(self, rule: StoppingRule) -> None:
        self.rule = rule
        self.kernel = RunningMean()
        self.differences = RunningMean()

    def add(self, kernel_ns: int, incumbent_ns: int | None) -> None:
        self.kernel.add(kernel_ns)
        if incumbent_ns is not None:
            self.differences.add(kernel_ns - incumbent_ns)

    def reason(
        self, elapsed: float, kernel_ns: Sequence[int], incumbent_ns: Sequence[int]
    ) -> str | None:
        """Why the run stops now (`settled`, `fixed count`, `max runs`, `max seconds`, `lost`,
        `slower`), or None to time another round."""
        rule, runs = self.rule, self.kernel.count
        if elapsed >= rule.max_seconds and runs >= 3:
            return "max seconds"
        if elapsed < rule.min_seconds:
            return None
        if incumbent_ns and lost(kernel_ns, incumbent_ns):
            return "lost"
        if runs < rule.min_runs:
            return None
        if rule.half_width is None:
            return "fixed count"
        if self.kernel.within(rule.half_width):
            return "settled"
        if incumbent_ns and slower_beyond_chance(self.differences):
            return "slower"
        if runs >= rule.max_runs:
            return "max runs"
        return None
