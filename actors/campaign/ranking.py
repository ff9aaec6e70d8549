"""The ranking rules of a campaign: kernels compared by their own time at the campaign's
shape, the baseline as one campaign-level figure, and promotion only by a head-to-head
run. `actors.campaign.leaderboard` turns them into the leaderboard's rows.

Each candidate's speedup is a ratio over its own baseline samples, which drift by tens of
percent over a campaign on a shared host; ranking by it can put a slower kernel first.
Here:
- a run's time is `BenchmarkCompleted.time_ns`: the mean over its timed calls, which
  moving work from one call to another cannot lower (a median can: heavy, light, light
  calls read as light), or the median in events recorded before the mean was kept; the
  median and IQR stay beside it as descriptive figures;
- timed kernels compare by their own time (IQR beside it) at the campaign's shape, and
  every speedup is stated against the campaign's baseline: the median of all its
  candidates' baseline times, reported with their spread. A kernel's own time is the
  median of the times of every run that timed it: its own, and each later head-to-head
  run that timed it as the incumbent (`own_times`). Runs are separate processes on fresh
  inputs, so no work moves between them. The best is timed again in every such run, so
  one run of it on a busy host does not stand as its figure;
- the best (the incumbent new kernels are timed against) changes only when a kernel beat
  it in a head-to-head interleaved run (`BenchmarkCompleted.head_to_head`, written by
  `gpu_workers.benchmarking.head_to_head`, which re-measures both when they are within
  noise). A kernel timed against another incumbent, or none, replaces the best only when
  its own time is faster beyond both kernels' noise.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from actors.campaign.history import Candidate


@dataclass(frozen=True)
class CampaignBaseline:
    """The baseline of a campaign: the median of its candidates' baseline times."""

    name: str
    median_ns: float
    q1_ns: float
    q3_ns: float
    candidates: int

    @property
    def spread(self) -> float:
        """(q3 - q1) / median of the candidates' baseline times."""
        return (self.q3_ns - self.q1_ns) / self.median_ns if self.median_ns else 0.0

    def words(self) -> str:
        return (
            f"{self.name} {self.median_ns / 1e6:.3f} ms (median of {self.candidates} "
            f"candidates' times, IQR {self.q1_ns / 1e6:.3f}-{self.q3_ns / 1e6:.3f} ms)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "median_ns": self.median_ns,
            "q1_ns": self.q1_ns,
            "q3_ns": self.q3_ns,
            "iqr_ns": self.q3_ns - self.q1_ns,
            "candidates": self.candidates,
        }


Shape = tuple[tuple[str, int], ...]


def shape_key(candidate: Candidate) -> Shape:
    """The shape a timed kernel was timed at, its extents in the order of their names."""
    assert candidate.benchmark is not None
    return tuple(sorted(candidate.benchmark.shape.items()))


def at_campaign_shape(candidates: list[Candidate]) -> list[Candidate]:
    """Timed candidates at the shape most of them were timed at (a campaign times at one
    shape; times at two shapes never compete)."""
    timed = [(shape_key(c), c) for c in candidates if c.benchmark is not None]
    if not timed:
        return []
    shape, _ = Counter(key for key, _ in timed).most_common(1)[0]
    return [c for key, c in timed if key == shape]


def campaign_baseline(candidates: list[Candidate]) -> CampaignBaseline | None:
    """One baseline figure for the campaign, with its spread over candidates."""
    timed = at_campaign_shape(candidates)
    if not timed:
        return None
    times = [c.benchmark.baseline_time_ns for c in timed if c.benchmark is not None]
    q1, median, q3 = np.percentile(np.asarray(times, dtype=np.float64), [25, 50, 75])
    name = timed[0].benchmark.baseline if timed[0].benchmark is not None else ""
    return CampaignBaseline(name, float(median), float(q1), float(q3), len(times))


@dataclass(frozen=True)
class OwnTime:
    """A kernel's time at the campaign's shape: the median of the times (`time_ns`) of the
    runs that timed it, and the IQR of its own run."""

    median_ns: float
    iqr_ns: float
    runs: int


def own_times(candidates: list[Candidate]) -> dict[str, OwnTime]:
    """Each timed kernel's own time, by candidate id, over its own run and every
    head-to-head run at the campaign's shape that timed it as the incumbent. Such a run
    records the challenger's time and `speedup_vs_incumbent`, the incumbent's time over
    the challenger's: their product is the incumbent's time in that run."""
    timed = at_campaign_shape(candidates)
    times: dict[str, list[float]] = {}
    for c in timed:
        assert c.benchmark is not None
        times[c.candidate_id] = [c.benchmark.time_ns]
    for c in timed:
        assert c.benchmark is not None
        incumbent, ratio = c.benchmark.incumbent, c.benchmark.speedup_vs_incumbent
        if incumbent is not None and incumbent in times and ratio is not None:
            times[incumbent].append(c.benchmark.time_ns * ratio)
    return {c.candidate_id: _own_time(c, times[c.candidate_id]) for c in timed}


def relative_speeds(candidates: list[Candidate]) -> dict[str, float]:
    """Each timed kernel's speed relative to the fastest timed at its shape, by candidate
    id: the fastest own time (`own_times`) over its own, 1 for the fastest. What the
    template search and its priors tell optuna: kernels at one shape are timed on the same
    kind of memory, while a speedup also divides by one run's baseline, whose time moves
    with the host (in eight campaigns at softmax 4096x4096 on one host, speedup and speed
    ranked the 15 fastest kernels alike at only 0.44 to 0.88)."""
    by_shape: dict[Shape, list[Candidate]] = {}
    for c in candidates:
        if c.benchmark is not None:
            by_shape.setdefault(shape_key(c), []).append(c)
    speeds: dict[str, float] = {}
    for same_shape in by_shape.values():
        times = {cid: own.median_ns for cid, own in own_times(same_shape).items()}
        fastest = min(times.values())
        speeds |= {cid: fastest / t if t > 0 else 0.0 for cid, t in times.items()}
    return speeds


def _own_time(candidate: Candidate, times: list[float]) -> OwnTime:
    """A kernel's own time over the times of the runs that timed it (its own first)."""
    assert candidate.benchmark is not None
    return OwnTime(
        median_ns=float(statistics.median(times)),
        iqr_ns=candidate.benchmark.iqr_ns,
        runs=len(times),
    )


def head_to_head_words(challenger: Candidate, incumbent: Candidate) -> tuple[bool, str] | None:
    """What the challenger's head-to-head run against `incumbent` decided, and in which
    words: "beat", "not clearly faster than" (a ratio of means, or in an older event of
    medians, below 1, but not beyond chance) or "lost to"; None when it was not timed
    against that kernel."""
    assert challenger.benchmark is not None
    versus = challenger.benchmark.head_to_head
    if challenger.benchmark.incumbent != incumbent.candidate_id or versus is None:
        return None
    if versus.faster:
        return True, "beat"
    ratio = versus.ratio_median if versus.ratio_of_means is None else versus.ratio_of_means
    return False, "not clearly faster than" if ratio < 1.0 else "lost to"


def clearly_faster(challenger: Candidate, incumbent: Candidate) -> bool:
    """Run times apart by more than both kernels' half IQRs (no head-to-head to go by)."""
    a, b = challenger.benchmark, incumbent.benchmark
    assert a is not None and b is not None
    return a.time_ns + a.iqr_ns / 2 < b.time_ns - b.iqr_ns / 2


def _timed_at(candidate: Candidate) -> datetime:
    assert candidate.benchmark is not None
    return candidate.benchmark.ts


def short_id(candidate_id: str) -> str:
    """`gN:cM`, a candidate's generation and number without its campaign."""
    return ":".join(candidate_id.rsplit(":", 2)[-2:])


class PromotionWalk:
    """The promotion walk (see `promotions`), one kernel at a time in the order they were
    timed, with each timed kernel's standing in words: a reader that sees kernels timed
    one after another extends it instead of walking them all again."""

    def __init__(self) -> None:
        self.chain: list[Candidate] = []
        self.standing: dict[str, str] = {}

    def add(self, challenger: Candidate) -> None:
        if not self.chain:
            self.chain.append(challenger)
            self.standing[challenger.candidate_id] = "promoted: timed first"
            return
        best = self.chain[-1]
        decided = head_to_head_words(challenger, best)
        if decided is not None:
            verdict, words = decided
            how = f"{words} {short_id(best.candidate_id)} head to head"
        else:
            verdict = clearly_faster(challenger, best)
            how = ("faster than " if verdict else "not clearly faster than ") + (
                f"{short_id(best.candidate_id)} by own time"
            )
        self.standing[challenger.candidate_id] = ("promoted: " if verdict else "") + how
        if verdict:
            self.chain.append(challenger)


def timing_order(candidates: list[Candidate]) -> list[Candidate]:
    """Timed kernels in the order they were timed (ties in the order given)."""
    return sorted(candidates, key=_timed_at)


class RunningBest:
    """`promotions` of a list of kernels that grows (a campaign's as its kernels are
    timed, a campaign's up to each generation): the walk at each shape is extended as
    kernels are added, walked again only when one was timed out of order, and the whole
    list is walked when two shapes have as many kernels (then its order decides)."""

    def __init__(self) -> None:
        self.shapes: Counter[Shape] = Counter()
        self.walks: dict[Shape, PromotionWalk] = {}
        self.latest: dict[Shape, datetime] = {}
        self.stale: set[Shape] = set()

    def add(self, candidate: Candidate) -> None:
        """A kernel just timed (in the list's order)."""
        assert candidate.benchmark is not None
        shape, ts = shape_key(candidate), candidate.benchmark.ts
        self.shapes[shape] += 1
        if shape in self.stale or (shape in self.latest and ts <= self.latest[shape]):
            self.stale.add(shape)
            return
        self.walks.setdefault(shape, PromotionWalk()).add(candidate)
        self.latest[shape] = ts

    def shape(self) -> Shape | None:
        """The shape most kernels were timed at; None when none, or two tie."""
        if not self.shapes:
            return None
        (shape, count), *runner_up = self.shapes.most_common(2)
        return None if runner_up and runner_up[0][1] == count else shape

    def chain(self, candidates: Callable[[], list[Candidate]]) -> list[Candidate]:
        """`promotions` of the list added so far, which `candidates` gives when it must be
        walked again."""
        shape = self.shape()
        if shape is None:
            return promotions(candidates())
        if shape in self.stale:
            timed = [c for c in candidates() if c.benchmark is not None and shape_key(c) == shape]
            walk = self.walks[shape] = PromotionWalk()
            for challenger in timing_order(timed):
                walk.add(challenger)
            self.latest[shape] = max(_timed_at(c) for c in timed)
            self.stale.discard(shape)
        return self.walks[shape].chain


def promotion_walk(candidates: list[Candidate]) -> PromotionWalk:
    """The promotion walk over these kernels' timed ones at the campaign's shape."""
    walk = PromotionWalk()
    for challenger in timing_order(at_campaign_shape(candidates)):
        walk.add(challenger)
    return walk


def promotions(candidates: list[Candidate]) -> list[Candidate]:
    """The kernels that became the best, in the order they were promoted: walking the
    kernels in the order they were timed, the first timed kernel, then each kernel that
    beat the best of its time head to head (or, timed against another kernel, is clearly
    faster by its own time)."""
    return promotion_walk(candidates).chain


def standings(candidates: list[Candidate]) -> dict[str, str]:
    """Why each timed kernel is or is not the best, by candidate id: "promoted: beat g0:c1
    head to head", "lost to g0:c1 head to head", "not clearly faster than g0:c1 head to
    head", "not clearly faster than g1:c0 by own time". A leaderboard shows it, since its
    other rows are sorted by own time, which can put a kernel faster than the best that
    never beat it."""
    return promotion_walk(candidates).standing


def best_of(candidates: list[Candidate]) -> Candidate | None:
    """The best of these kernels: the last one promoted (`promotions`). Over a campaign's
    candidates, its incumbent; over one generation's, that generation's best."""
    chain = promotions(candidates)
    return chain[-1] if chain else None


def speedup_over(time: OwnTime | None, baseline: CampaignBaseline | None) -> float | None:
    """The campaign baseline's median over a kernel's own time."""
    if time is None or baseline is None or time.median_ns <= 0:
        return None
    return baseline.median_ns / time.median_ns


class RunningBoard:
    """The best and the own times of a list of kernels that grows (a campaign's up to each
    generation), as `best_of` and `own_times` give them, without ranking the whole list
    again at each step (which made replaying a long campaign quadratic)."""

    def __init__(self) -> None:
        self.candidates: list[Candidate] = []
        self.best = RunningBest()
        self._runs: dict[tuple[Shape, str], list[float]] = {}
        """(shape, incumbent) -> the incumbent's times in the runs that timed it."""

    def add(self, candidates: list[Candidate]) -> None:
        self.candidates += candidates
        for c in candidates:
            timed = c.benchmark
            if timed is None:
                continue
            self.best.add(c)
            if timed.incumbent is not None and timed.speedup_vs_incumbent is not None:
                incumbent = self._runs.setdefault((shape_key(c), timed.incumbent), [])
                incumbent.append(timed.time_ns * timed.speedup_vs_incumbent)

    def chain(self) -> list[Candidate]:
        return self.best.chain(lambda: self.candidates)

    def own_time(self, candidate: Candidate) -> OwnTime | None:
        shape = self.best.shape()
        if shape is None:  # two shapes tie: the list's order decides, as own_times says
            return own_times(self.candidates).get(candidate.candidate_id)
        if candidate.benchmark is None or shape_key(candidate) != shape:
            return None
        runs = self._runs.get((shape, candidate.candidate_id), [])
        return _own_time(candidate, [candidate.benchmark.time_ns, *runs])
