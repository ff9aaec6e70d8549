"""A campaign's leaderboard, the one read model every view of it renders: a typed row per
kernel timed at the campaign's shape, the best first (the last kernel promoted, by a
head-to-head run), then the others by their own time, each with its speedup over the
campaign's baseline and why it is or is not the best (`actors.campaign.ranking` holds
the rules).

`kfactory run`, `report`, `best`, `replay`, `campaigns`, the progress display and the
audit render these rows. The SQL `leaderboard` view (`eventstore.views`) gives the same
figures in its own order (by own time alone: the promotion walk is sequential), and
tests/test_leaderboard.py pins the two together over recorded campaigns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.campaign.history import Candidate, History
from actors.campaign.ranking import (
    CampaignBaseline,
    OwnTime,
    at_campaign_shape,
    campaign_baseline,
    own_times,
    promotion_walk,
    speedup_over,
)
from eventstore.events import BenchmarkCompleted, HeadToHeadRecord, KernelWritten


@dataclass(frozen=True)
class Row:
    """One kernel on the leaderboard. `median_ns` is its own time: the median of the times
    (`BenchmarkCompleted.time_ns`: the mean over the timed calls) of every run that timed
    it (`runs` of them: its own and each head-to-head run that timed it as the best);
    `run_mean_ns` (None in events recorded before it was kept), `iqr_ns`, `q1_ns`, `q3_ns`
    and `run_median_ns` are its own run's; `speedup` is over the campaign's baseline,
    `own_baseline_speedup` over its own run's baseline."""

    rank: int
    candidate_id: str
    generation: int
    template: str
    params: dict[str, Any]
    shape: dict[str, int]
    median_ns: float
    iqr_ns: float
    runs: int
    speedup: float | None
    standing: str
    """Why it is or is not the best: "promoted: beat g0:c1 head to head", "lost to g0:c1
    head to head", "not clearly faster than g1:c0 by own time" (`ranking.standings`)."""
    run_median_ns: float
    run_mean_ns: float | None
    q1_ns: float | None
    q3_ns: float | None
    own_baseline_speedup: float
    roofline_fraction: float
    head_to_head: HeadToHeadRecord | None
    source_hash: str
    timed: BenchmarkCompleted
    written: KernelWritten
    candidate: Candidate


def _row(
    rank: int, c: Candidate, own: OwnTime, baseline: CampaignBaseline | None, standing: str
) -> Row:
    timed, written = c.benchmark, c.written
    assert timed is not None and written is not None, "a row is a timed, written kernel"
    return Row(
        rank=rank,
        candidate_id=c.candidate_id,
        generation=c.proposal.generation,
        template=c.proposal.template,
        params=c.proposal.params,
        shape=timed.shape,
        median_ns=own.median_ns,
        iqr_ns=own.iqr_ns,
        runs=own.runs,
        speedup=speedup_over(own, baseline),
        standing=standing,
        run_median_ns=timed.median_ns,
        run_mean_ns=timed.mean_ns,
        q1_ns=timed.q1_ns,
        q3_ns=timed.q3_ns,
        own_baseline_speedup=timed.speedup,
        roofline_fraction=timed.roofline_fraction,
        head_to_head=timed.head_to_head,
        source_hash=written.source_hash,
        timed=timed,
        written=written,
        candidate=c,
    )


@dataclass(frozen=True)
class Leaderboard:
    rows: list[Row]
    """Timed kernels at the campaign's shape that have their source: the best first."""
    best: Row | None
    """The last kernel promoted (`ranking.best_of`): the campaign's incumbent."""
    baseline: CampaignBaseline | None
    times: dict[str, OwnTime]
    """Every timed kernel's own time at the campaign's shape, by candidate id."""

    def own_time(self, candidate_id: str) -> OwnTime | None:
        return self.times.get(candidate_id)

    def speedup_of(self, candidate_id: str) -> float | None:
        """The campaign baseline over a kernel's own time; None if not timed at the shape."""
        return speedup_over(self.times.get(candidate_id), self.baseline)


def leaderboard(candidates: list[Candidate]) -> Leaderboard:
    """The leaderboard of these kernels (a campaign's, or a campaign's up to a generation)."""
    timed = at_campaign_shape(candidates)  # what each rule below takes of the list
    times = own_times(timed)
    baseline = campaign_baseline(timed)
    walk = promotion_walk(timed)
    standing = walk.standing
    promoted = walk.chain[-1] if walk.chain else None
    by_own_time = sorted(timed, key=lambda c: times[c.candidate_id].median_ns)
    order = ([promoted] if promoted else []) + [c for c in by_own_time if c is not promoted]
    rows = [
        _row(rank, c, times[c.candidate_id], baseline, standing.get(c.candidate_id, ""))
        for rank, c in enumerate([c for c in order if c.written], 1)
    ]
    best = rows[0] if rows and rows[0].candidate is promoted else None
    return Leaderboard(rows=rows, best=best, baseline=baseline, times=times)


def campaign_leaderboard(history: History, campaign_id: str) -> Leaderboard:
    return leaderboard(history.campaign_candidates(campaign_id))
