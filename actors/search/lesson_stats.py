"""The statistics lessons state how sure they are with, in plain Python (no scipy).

- `Moments`: a sample's count, mean and sum of squared deviations, kept one value at a
  time (Welford) and split (`without`: the rest of a template once a group is taken out),
  so a lesson's summary is a fixed size however many kernels it covers, and merged
  (`Moments.merged`: the problems of a family, each tallied on its own);
- `mean_interval`: the interval of one sample's mean (Student's t);
- `welch_interval`: the interval of a difference of two means with unequal variances
  (Welch's t, its Welch–Satterthwaite degrees of freedom), the quantile of Student's t
  found from its CDF (the regularised incomplete beta function);
- `fisher_greater`: the one-sided Fisher exact test, the hypergeometric upper tail summed
  in log space from `math.lgamma`;
- `wilson_interval`: the interval of a proportion.

Every function is deterministic: the librarian and the audit compute the same floats.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

CONFIDENCE = 0.95


@dataclass
class Moments:
    """Count, mean and sum of squared deviations of a sample, one value at a time."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    @property
    def variance(self) -> float:
        """The sample variance (n - 1); 0 for fewer than two values."""
        return self.m2 / (self.n - 1) if self.n > 1 else 0.0

    @property
    def pstdev(self) -> float:
        return math.sqrt(self.m2 / self.n) if self.n else 0.0

    @classmethod
    def merged(cls, parts: Iterable[Moments]) -> Moments:
        """The moments of the union of disjoint samples (Chan's pairwise update)."""
        out = cls()
        for part in parts:
            n = out.n + part.n
            if part.n == 0:
                continue
            if out.n == 0:
                out = cls(part.n, part.mean, part.m2)
                continue
            delta = part.mean - out.mean
            out.m2 += part.m2 + delta * delta * out.n * part.n / n
            out.mean += delta * part.n / n
            out.n = n
        return out

    def without(self, part: Moments) -> Moments:
        """The moments of this sample less `part` (a subset of it)."""
        n = self.n - part.n
        if n <= 0:
            return Moments()
        mean = (self.n * self.mean - part.n * part.mean) / n
        delta = part.mean - mean
        m2 = self.m2 - part.m2 - delta * delta * part.n * n / self.n
        return Moments(n, mean, max(m2, 0.0))


@dataclass(frozen=True)
class Interval:
    """A mean or a difference of means, its interval at `CONFIDENCE`, and the degrees of
    freedom."""

    difference: float
    low: float
    high: float
    df: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def welch_interval(a: Moments, b: Moments, confidence: float = CONFIDENCE) -> Interval:
    """The interval of mean(a) - mean(b) (each of at least two values)."""
    difference = a.mean - b.mean
    va, vb = a.variance / a.n, b.variance / b.n
    se2 = va + vb
    if se2 <= 0:
        return Interval(difference, difference, difference, math.inf)
    df = se2 * se2 / (va * va / (a.n - 1) + vb * vb / (b.n - 1))
    half = t_quantile(1 - (1 - confidence) / 2, df) * math.sqrt(se2)
    return Interval(difference, difference - half, difference + half, df)


def mean_interval(sample: Moments, confidence: float = CONFIDENCE) -> Interval:
    """The interval of the mean of `sample` (of at least two values), Student's t."""
    se2 = sample.variance / sample.n
    if se2 <= 0:
        return Interval(sample.mean, sample.mean, sample.mean, math.inf)
    df = float(sample.n - 1)
    half = t_quantile(1 - (1 - confidence) / 2, df) * math.sqrt(se2)
    return Interval(sample.mean, sample.mean - half, sample.mean + half, df)


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1) / (a + b + 2):
        return front * _continued_fraction(a, b, x) / a
    return 1.0 - front * _continued_fraction(b, a, 1 - x) / b


def t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom, t >= 0."""
    return 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t))


def _t_density(t: float, df: float) -> float:
    return math.exp(
        math.lgamma((df + 1) / 2)
        - math.lgamma(df / 2)
        - 0.5 * math.log(df * math.pi)
        - (df + 1) / 2 * math.log1p(t * t / df)
    )


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The `p` quantile of Student's t (p > 1/2): Newton's method on the exact tail from
    the Cornish-Fisher expansion, which alone is within 1e-9 beyond 100 degrees."""
    z = NormalDist().inv_cdf(p)
    if math.isinf(df):
        return z
    z2 = z * z
    t = z + sum(
        term / df**power
        for power, term in enumerate(
            (
                (z2 + 1) * z / 4,
                ((5 * z2 + 16) * z2 + 3) * z / 96,
                (((3 * z2 + 19) * z2 + 17) * z2 - 15) * z / 384,
                ((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) * z / 92160,
            ),
            1,
        )
    )
    if df > 100:
        return t
    for _ in range(60):
        step = (t_upper_tail(t, df) - (1 - p)) / _t_density(t, df)
        t += step
        if abs(step) <= 1e-12 * t:
            break
    return t


def _log_pmf(x: int, population: int, successes: int, draws: int) -> float:
    def log_comb(n: int, k: int) -> float:
        return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)

    return (
        log_comb(successes, x)
        + log_comb(population - successes, draws - x)
        - log_comb(population, draws)
    )


def fisher_greater(hits: int, draws: int, other_hits: int, other_draws: int) -> float:
    """One-sided Fisher exact test: the chance of `hits` or more of `draws` when the
    `hits + other_hits` of all `draws + other_draws` fell at random (a rate above the
    other's). The hypergeometric tail is summed from the smaller side of its mode, each
    term from the one before."""
    population, successes = draws + other_draws, hits + other_hits
    low, high = max(0, draws - (population - successes)), min(draws, successes)
    if draws == 0 or hits <= low:
        return 1.0
    mode = (draws + 1) * (successes + 1) // (population + 2)
    rest = population - successes - draws
    upward = hits > mode
    x = hits if upward else hits - 1
    term = math.exp(_log_pmf(x, population, successes, draws))
    total = 0.0
    while low <= x <= high and term >= total * 1e-17:
        total += term
        if upward:
            term *= (successes - x) * (draws - x) / ((x + 1) * (rest + x + 1))
            x += 1
        else:
            term *= x * (rest + x) / ((successes - x + 1) * (draws - x + 1))
            x -= 1
    return min(1.0, total) if upward else min(1.0, max(0.0, 1.0 - total))


def wilson_interval(hits: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of the proportion hits / n."""
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
