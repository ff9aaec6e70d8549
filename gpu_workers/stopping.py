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
A kernel faster on average so far is timed on, even once its interval is tight, until it
has the evidence a promotion asks for (`faster_beyond_chance`: that z-test and the sign
test at `PROMOTION_ALPHA`), its mean falls behind the incumbent's, or `PROVE_RUNS` (30)
rounds: a promising kernel gets the rounds to prove itself, a slow one stops early.

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
MAX_SECONDS = 3.0
"""Timed seconds after which a run stops with 3 rounds at least: a slow kernel's timing
costs at most this, whatever its spread."""
LOSS_ROUNDS = 8
LOSS_RATIO = 1.25
"""A kernel slower than the incumbent by this factor in each of the first `LOSS_ROUNDS`
paired rounds has lost the head-to-head: the median of its paired ratios is at least this
factor, and more rounds are not needed to say so."""
MEAN_Z = 1.645
"""One-sided 5%: how many standard errors the kernel's mean time per round must be below
the incumbent's to be promoted (`gpu_workers.benchmarking.head_to_head`), or above it for
the run to stop as lost. Shifting work between calls cannot lower the mean difference, and
only widens its spread."""
PROVE_RUNS = 30
"""Rounds a kernel faster on average may take to prove it (`faster_beyond_chance`), as many
as every head-to-head had before the rule adapted; one still in doubt then is timed again
and pooled (`gpu_workers.benchmarking.pool_a_head_to_head_in_doubt`)."""
PROMOTION_ALPHA = 0.05
"""A kernel beats the incumbent only with more round wins than two kernels of equal speed
(each round a fair coin) would give in more than this share of head-to-heads."""


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


def wins_by_chance(wins: int, rounds: int) -> float:
    """How often two kernels of equal speed give at least `wins` of `rounds` to one of them:
    the one-sided sign test."""
    return sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2**rounds


def _standard_error(differences: RunningMean) -> float:
    return differences.half_width() / t_quantile_975(differences.count - 1)


def slower_beyond_chance(differences: RunningMean) -> bool:
    """The kernel's mean time per round (`differences`: kernel ns less incumbent ns, round by
    round) is above the incumbent's by more than `MEAN_Z` standard errors."""
    if differences.count < 2:
        return False
    return differences.mean > 0 and differences.mean > MEAN_Z * _standard_error(differences)


def faster_beyond_chance(differences: RunningMean, wins: int) -> bool:
    """The evidence a promotion asks for (`gpu_workers.benchmarking.head_to_head`): the mean
    time per round below the incumbent's by more than `MEAN_Z` standard errors, and `wins`
    rounds of `differences.count` more than chance would give at `PROMOTION_ALPHA`."""
    if differences.count < 2:
        return False
    below = differences.mean < 0 and differences.mean < -MEAN_Z * _standard_error(differences)
    return below and wins_by_chance(wins, differences.count) <= PROMOTION_ALPHA


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
        self.wins = 0

    def add(self, kernel_ns: int, incumbent_ns: int | None) -> None:
        self.kernel.add(kernel_ns)
        if incumbent_ns is not None:
            self.differences.add(kernel_ns - incumbent_ns)
            self.wins += kernel_ns < incumbent_ns

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
        if incumbent_ns and slower_beyond_chance(self.differences):
            return "slower"
        if self.kernel.within(rule.half_width) and not self._still_to_prove(incumbent_ns):
            return "settled"
        if runs >= rule.max_runs:
            return "max runs"
        return None

    def _still_to_prove(self, incumbent_ns: Sequence[int]) -> bool:
        """Against an incumbent, the kernel is faster on average so far but not yet by the
        evidence a promotion asks for, in fewer than `PROVE_RUNS` rounds: more may give it."""
        if not incumbent_ns or self.differences.mean >= 0 or self.kernel.count >= PROVE_RUNS:
            return False
        return not faster_beyond_chance(self.differences, self.wins)
