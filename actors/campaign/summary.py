"""What a campaign has spent and what it came to, from its history."""

from __future__ import annotations

from typing import Any

from actors.campaign.history import Campaign, History
from actors.campaign.leaderboard import campaign_leaderboard


def identity(campaign: Campaign) -> dict[str, Any]:
    """What names a campaign in every listing of it: its id, problem, target, dtype, shapes."""
    spec = campaign.spec
    return {
        "campaign_id": campaign.started.campaign_id,
        "problem": spec.problem,
        "target": spec.target,
        "dtype": spec.dtype,
        "shapes": spec.shapes,
    }


def spent_candidates(history: History, campaign: Campaign) -> int:
    """Candidates that count against the budget: all proposed but the deduplicated."""
    return sum(
        1 for c in history.campaign_candidates(campaign.started.campaign_id) if c.duplicate is None
    )


def summary(history: History, campaign: Campaign) -> dict[str, Any]:
    campaign_id = campaign.started.campaign_id
    candidates = history.campaign_candidates(campaign_id)
    board = campaign_leaderboard(history, campaign_id)
    # the final run's winner, once it was timed; else the incumbent
    best = board.best.candidate if board.final and board.best else history.best(campaign_id)
    return {
        "evaluated": sum(1 for c in candidates if c.evaluated),
        "duplicates_avoided": sum(1 for c in candidates if c.duplicate),
        "rejected_by_stage": history.rejections_by_stage(campaign_id),
        "generations": len(campaign.generations),
        "best": None
        if best is None or best.benchmark is None
        else {
            "candidate_id": best.candidate_id,
            "speedup": best.benchmark.speedup,
            "roofline_fraction": best.benchmark.roofline_fraction,
            "median_ns": best.benchmark.median_ns,
            "baseline": best.benchmark.baseline,
            "baseline_ns": best.benchmark.baseline_ns,
            "source_hash": best.benchmark.source_hash,
        },
    }
