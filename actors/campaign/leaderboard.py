"""A campaign's leaderboard, the one read model every view of it renders: a typed row per
kernel timed at the campaign's shape, the best first (the last kernel promoted, by a
head-to-head run), then the others by their pooled time, each with why it is or is not
the best (`actors.campaign.ranking` holds the rules). Once the campaign's final run is
recorded (`FinalRankingTimed`: its top kernels timed together in one interleaved run; the
latest, where a final answer asked for later timed another), its contenders come first in
that run's order (by its mean; rank 1, the best, is its winner), then the others by
pooled time; `Row.decided_by` says which rule placed a row,
and `Row.final` holds the final run's figures and spread for its contenders.

A kernel has one figure everywhere: its time (`Row.median_ns`, with `iqr_ns` the spread
of the same run) and its speedup (`Row.speedup`) over the baseline measured in the same
run, as its `BenchmarkCompleted` recorded them. The ranking's own figures are named for
what they are: `pooled_median_ns` (the median over every run that timed the kernel, what
the order goes by) and `speedup_vs_campaign_baseline`. Views read these fields and never
recompute them.

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
from eventstore.events import (
    BenchmarkCompleted,
    FinalContender,
    FinalRankingTimed,
    HeadToHeadRecord,
    KernelWritten,
)


@dataclass(frozen=True)
class Figure:
    """A kernel's one figure, from its own timing run: its time, that run's spread in the
    same units, and its speedup over the baseline timed in the same run."""

    median_ns: float
    iqr_ns: float
    q1_ns: float | None
    q3_ns: float | None
    speedup: float


def figure_of(timed: BenchmarkCompleted) -> Figure:
    """The figure a timing result gives its kernel: every view's time and speedup."""
    return Figure(timed.median_ns, timed.iqr_ns, timed.q1_ns, timed.q3_ns, timed.speedup)


@dataclass(frozen=True)
class Row:
    """One kernel on the leaderboard. Its figure: `median_ns` (with `iqr_ns`, `q1_ns`,
    `q3_ns`) and `speedup` over the baseline timed in that run, all from its own timing
    run; the speedup is the ratio of the means over the timed calls (the baseline's over
    the kernel's, `run_mean_ns`), which moving work from one call to another cannot lower,
    the median and IQR beside it describe the calls (events recorded before the mean was
    kept: the medians' ratio). The ranking's: `pooled_median_ns`, the median of the run
    times (the mean, or the median before it was kept) over every run that timed it
    (`runs` of them: its own and each head-to-head run that timed it as the best), and
    `speedup_vs_campaign_baseline`, the campaign baseline over that."""

    rank: int
    candidate_id: str
    generation: int
    template: str
    params: dict[str, Any]
    shape: dict[str, int]
    median_ns: float
    iqr_ns: float
    runs: int
    speedup: float
    standing: str
    """Why it is or is not the best: "promoted: beat g0:c1 head to head", "lost to g0:c1
    head to head", "not clearly faster than g1:c0 by own time" (`ranking.standings`)."""
    pooled_median_ns: float
    run_mean_ns: float | None
    q1_ns: float | None
    q3_ns: float | None
    speedup_vs_campaign_baseline: float | None
    roofline_fraction: float
    head_to_head: HeadToHeadRecord | None
    source_hash: str
    timed: BenchmarkCompleted
    written: KernelWritten
    candidate: Candidate
    decided_by: str = ""
    """How its rank was decided: "final run of 4 (30 rounds)", "promoted head to head",
    "pooled time over 3 runs"."""
    final: FinalContender | None = None
    """Its figures in the campaign's final run (mean, median, IQR, rounds), where it was
    placed by that run."""


def decided_by(own: OwnTime, promoted: bool, final: FinalRankingTimed | None) -> str:
    """How a row's rank was decided (`final` where the final run placed it)."""
    if final is not None:
        return f"final run of {len(final.contenders)} ({final.rounds} rounds)"
    if promoted:
        return "promoted head to head"
    return f"pooled time over {own.runs} run{'s' if own.runs != 1 else ''}"


def _row(
    rank: int,
    c: Candidate,
    own: OwnTime,
    baseline: CampaignBaseline | None,
    standing: str,
    decided: str,
    final: FinalContender | None,
) -> Row:
    timed, written = c.benchmark, c.written
    assert timed is not None and written is not None, "a row is a timed, written kernel"
    figure = figure_of(timed)
    return Row(
        rank=rank,
        candidate_id=c.candidate_id,
        generation=c.proposal.generation,
        template=c.proposal.template,
        params=c.proposal.params,
        shape=timed.shape,
        median_ns=figure.median_ns,
        iqr_ns=figure.iqr_ns,
        runs=own.runs,
        speedup=figure.speedup,
        standing=standing,
        pooled_median_ns=own.median_ns,
        q1_ns=figure.q1_ns,
        q3_ns=figure.q3_ns,
        speedup_vs_campaign_baseline=speedup_over(own, baseline),
        run_mean_ns=timed.mean_ns,
        roofline_fraction=timed.roofline_fraction,
        head_to_head=timed.head_to_head,
        source_hash=written.source_hash,
        timed=timed,
        written=written,
        candidate=c,
        decided_by=decided,
        final=final,
    )


@dataclass(frozen=True)
class Leaderboard:
    rows: list[Row]
    """Timed kernels at the campaign's shape that have their source: the best first."""
    best: Row | None
    """Rank 1: the final run's winner, or without one the last kernel promoted
    (`ranking.best_of`), the campaign's incumbent."""
    baseline: CampaignBaseline | None
    times: dict[str, OwnTime]
    """Every timed kernel's own time at the campaign's shape, by candidate id."""
    by_id: dict[str, Row]
    """The rows by candidate id."""
    final: FinalRankingTimed | None = None
    """The campaign's final run, whose order placed the first rows."""

    def own_time(self, candidate_id: str) -> OwnTime | None:
        return self.times.get(candidate_id)

    def row_of(self, candidate_id: str) -> Row | None:
        """A kernel's row; None if it was not timed at the campaign's shape."""
        return self.by_id.get(candidate_id)

    def speedup_of(self, candidate_id: str) -> float | None:
        """A kernel's figure (`Row.speedup`); None if not timed at the campaign's shape."""
        row = self.row_of(candidate_id)
        return row.speedup if row is not None else None


def leaderboard(candidates: list[Candidate], final: FinalRankingTimed | None = None) -> Leaderboard:
    """The leaderboard of these kernels (a campaign's, or a campaign's up to a generation),
    with the campaign's `final` run where it has one."""
    timed = at_campaign_shape(candidates)  # what each rule below takes of the list
    times = own_times(timed)
    baseline = campaign_baseline(timed)
    walk = promotion_walk(timed)
    standing = walk.standing
    promoted = walk.chain[-1] if walk.chain else None
    by_own_time = sorted(timed, key=lambda c: times[c.candidate_id].median_ns)
    writable = {c.candidate_id: c for c in timed if c.written}
    placed = [cid for cid in (final.order if final else []) if cid in writable]
    figures = {c.candidate_id: c for c in final.contenders} if final else {}
    first = [writable[cid] for cid in placed] or ([promoted] if promoted else [])
    order = first + [c for c in by_own_time if c not in first]
    rows = []
    for rank, c in enumerate([c for c in order if c.written], 1):
        own, in_final = times[c.candidate_id], c.candidate_id in placed
        decided = decided_by(own, c is promoted and not placed, final if in_final else None)
        figure = figures[c.candidate_id] if in_final else None
        rows.append(_row(rank, c, own, baseline, standing.get(c.candidate_id, ""), decided, figure))
    best = rows[0] if rows and (placed or rows[0].candidate is promoted) else None
    by_id = {row.candidate_id: row for row in rows}
    return Leaderboard(
        rows=rows,
        best=best,
        baseline=baseline,
        times=times,
        by_id=by_id,
        final=final if placed else None,
    )


def campaign_leaderboard(history: History, campaign_id: str) -> Leaderboard:
    """The campaign's leaderboard, placed by its latest final run where it has one."""
    final = history.campaigns[campaign_id].final_ranking
    return leaderboard(history.campaign_candidates(campaign_id), final)
