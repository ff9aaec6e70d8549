"""Campaigns side by side, from the history alone: one row per campaign, and the
differences between two campaigns of one problem."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from actors.campaign.history import Candidate, History
from actors.campaign.leaderboard import campaign_leaderboard
from actors.campaign.summary import identity


def evaluation_order(history: History, campaign_id: str) -> list[Candidate]:
    """Evaluated candidates in the order their verdicts were recorded."""
    done = [c for c in history.campaign_candidates(campaign_id) if c.evaluated]
    return sorted(done, key=_verdict_time)


def _verdict_time(candidate: Candidate) -> datetime:
    verdict = candidate.benchmark or candidate.rejected or candidate.verified
    assert verdict is not None, "only evaluated candidates are ordered"
    return verdict.ts


def evaluations_to_reach(history: History, campaign_id: str, share: float = 0.95) -> int | None:
    """How many evaluations it took for the best so far to reach `share` of the best."""
    order = evaluation_order(history, campaign_id)
    best = max((c.speedup or 0.0 for c in order), default=0.0)
    if best <= 0:
        return None
    for count, candidate in enumerate(order, 1):
        if (candidate.speedup or 0.0) >= share * best:
            return count
    return None


def row(history: History, campaign_id: str, last_ts: datetime | None) -> dict[str, Any]:
    campaign = history.campaigns[campaign_id]
    candidates = history.campaign_candidates(campaign_id)
    best = campaign_leaderboard(history, campaign_id).best
    started = campaign.started.ts
    end = campaign.finished.ts if campaign.finished else (last_ts or started)
    return {
        **identity(campaign),
        "state": f"finished: {campaign.finished.reason}" if campaign.finished else "unfinished",
        "evaluated": sum(c.evaluated for c in candidates),
        "best_candidate": best.candidate_id if best else None,
        "best_ms": best.median_ns / 1e6 if best else None,
        "best_speedup": best.speedup if best else None,
        "started": started.isoformat(),
        "wall_seconds": (end - started).total_seconds(),
    }


def diff(history: History, a: str, b: str) -> dict[str, Any]:
    """Best, evaluations to 95% of the best, rejections and lessons of two campaigns."""
    sides: dict[str, dict[str, Any]] = {}
    for campaign_id in (a, b):
        campaign = history.campaigns[campaign_id]
        candidates = history.campaign_candidates(campaign_id)
        best = campaign_leaderboard(history, campaign_id).best
        kinds = Counter(lesson.kind for lesson in campaign.lessons)
        sides[campaign_id] = {
            "best_candidate": best.candidate_id if best else None,
            "best_speedup": best.speedup if best else None,
            "best_ms": best.median_ns / 1e6 if best else None,
            "best_params": best.params if best else None,
            "best_template": best.template if best else None,
            "evaluated": sum(c.evaluated for c in candidates),
            "evaluations_to_95pct": evaluations_to_reach(history, campaign_id),
            "rejections": dict(Counter(c.rejected.stage for c in candidates if c.rejected)),
            "lessons": dict(kinds),
            "statements": {lesson.statement for lesson in campaign.lessons},
        }
    said_a: set[str] = sides[a].pop("statements")
    said_b: set[str] = sides[b].pop("statements")
    return {
        "problem": history.campaigns[a].spec.problem,
        "a": {"campaign_id": a, **sides[a]},
        "b": {"campaign_id": b, **sides[b]},
        "lessons_only_in_a": sorted(said_a - said_b),
        "lessons_only_in_b": sorted(said_b - said_a),
    }
