"""The planner: runs a campaign's lifecycle and proposes each generation's candidates.

On CampaignStarted it opens generation 0; on GenerationClosed it either finishes the
campaign (budget, wall time, the roofline target, or nothing left to try) or opens the
next generation. On CampaignResumed it continues a campaign whose last generation was
closed (work in flight resumes by itself: the bus redelivers it). Proposals come from
an optuna study rebuilt from the replayed history of the problem and target; the
librarian is asked which points were already evaluated, and lessons marking regions to
avoid are honoured.
"""

from __future__ import annotations

import time
from typing import Any

from actors.history import Campaign, History
from actors.librarian import SeenRequest, ask_lessons, ask_seen
from actors.replayer import HistoryReader
from actors.runtime import Actor, Reactions
from actors.search import Proposal, TemplateSearch
from actors.spaces import design_spaces, seed_points
from actors.variation import LLM_TEMPLATE, blank_page, seeds, variations
from bus.connection import Client
from eventstore.events import (
    ActorRef,
    CampaignFinished,
    CampaignResumed,
    CampaignStarted,
    CandidateProposed,
    Event,
    GenerationClosed,
    GenerationOpened,
)


class Planner(Actor):
    role = "planner"
    reacts_to = (CampaignStarted, CampaignResumed, GenerationClosed)

    def __init__(self) -> None:
        self._nc: Client | None = None
        self._reader: HistoryReader | None = None

    async def setup(self, nc: Client, ref: ActorRef) -> None:
        self._nc = nc
        self._reader = HistoryReader(nc)

    async def handle(self, event: Event, out: Reactions) -> None:
        assert self._reader is not None, "setup() runs first"
        history = await self._reader.catch_up(event.event_id)
        campaign = history.campaigns.get(event.campaign_id)
        if campaign is None or campaign.finished is not None:
            return
        if not campaign.generations:
            await self._open(history, campaign, 0, out)
            return
        last = max(campaign.generations)
        if campaign.generations[last].closed is None:
            return  # in flight: the bus redelivers what was not finished
        if isinstance(event, GenerationClosed) and event.generation != last:
            return
        reason = _finish_reason(history, campaign)
        if reason is None:
            await self._open(history, campaign, last + 1, out)
        else:
            out.emit(CampaignFinished, reason=reason, summary=summary(history, campaign))

    async def _open(
        self, history: History, campaign: Campaign, generation: int, out: Reactions
    ) -> None:
        assert self._nc is not None
        spec = campaign.spec
        remaining = spec.budget.candidates - spent_candidates(history, campaign)
        count = min(spec.search.per_generation, remaining)
        campaign_id = campaign.started.campaign_id
        if spec.writer.kind == "llm" and generation > 0:
            self._vary(history, campaign, generation, count, out)
            return
        avoid = await self._regions_to_avoid(campaign_id)
        scope = history.scope_candidates(spec.problem, spec.target, spec.dtype)

        nc = self._nc

        async def seen(keys: list[str]) -> set[str]:
            reply = await ask_seen(nc, SeenRequest(campaign_id, keys))
            return {key for key, owner in reply.keys.items() if owner is not None}

        known = await seen([c.proposal.param_key for c in scope])
        if spec.writer.kind == "llm":  # generation 0: the templates' best points seed the archive
            proposals = [p for p in seeds(spec) if p.key not in known]
            proposals = proposals[:count]
            if not proposals:  # no template, no seed: the LLM writes from the problem alone
                self._write(history, campaign, count, out)
                return
        else:
            proposals = [p for p in seed_points(spec) if p.key not in known][:count]
            if len(proposals) < count:
                search = TemplateSearch(
                    design_spaces(spec.problem, spec.target, spec.dtype, spec), spec.search.seed
                )
                taken = {p.key for p in proposals}
                proposals += search.propose(
                    scope,
                    count - len(proposals),
                    generation,
                    lambda p: p.key in known or p.key in taken or _avoided(p, avoid),
                )
        # The librarian has the last word on what was evaluated (other planners may race).
        fresh = await seen([p.key for p in proposals])
        proposals = [p for p in proposals if p.key not in fresh]
        _propose(
            history,
            campaign,
            generation,
            [{"template": p.template, "params": p.params, "param_key": p.key} for p in proposals],
            "nothing new to try in the design space",
            out,
        )

    def _vary(
        self, history: History, campaign: Campaign, generation: int, count: int, out: Reactions
    ) -> None:
        spec = campaign.spec
        campaign_id = campaign.started.campaign_id
        chosen = variations(
            history.campaign_candidates(campaign_id), count, generation, spec.search.seed
        )
        _propose(
            history,
            campaign,
            generation,
            [
                {
                    "template": LLM_TEMPLATE,
                    "params": {"family": v.family},
                    "param_key": v.key(campaign_id, generation),
                    "operator": v.operator,
                    "parents": v.parents,
                }
                for v in chosen
            ],
            "no parent to vary: every kernel so far failed before writing",
            out,
        )

    def _write(self, history: History, campaign: Campaign, count: int, out: Reactions) -> None:
        campaign_id = campaign.started.campaign_id
        _propose(
            history,
            campaign,
            0,
            [
                {
                    "template": LLM_TEMPLATE,
                    "params": {"family": v.family},
                    "param_key": v.key(campaign_id, 0),
                    "operator": v.operator,
                    "parents": [],
                }
                for v in blank_page(count)
            ],
            "nothing to write",
            out,
        )

    async def _regions_to_avoid(self, campaign_id: str) -> list[dict[str, Any]]:
        assert self._nc is not None
        lessons = await ask_lessons(self._nc, campaign_id)
        return [lesson.data for lesson in lessons if lesson.data.get("avoid")]


def _propose(
    history: History,
    campaign: Campaign,
    generation: int,
    candidates: list[dict[str, Any]],
    reason_if_none: str,
    out: Reactions,
) -> None:
    """Open the generation with these candidates, or finish the campaign if there are none."""
    if not candidates:
        out.emit(CampaignFinished, reason=reason_if_none, summary=summary(history, campaign))
        return
    spec = campaign.spec
    campaign_id = campaign.started.campaign_id
    out.emit(GenerationOpened, generation=generation, planned=len(candidates))
    for index, fields in enumerate(candidates):
        out.emit(
            CandidateProposed,
            problem=spec.problem,
            target=spec.target,
            dtype=spec.dtype,
            candidate_id=f"{campaign_id}:g{generation}:c{index}",
            generation=generation,
            **fields,
        )


def _avoided(proposal: Proposal, regions: list[dict[str, Any]]) -> bool:
    return any(
        region.get("template") == proposal.template
        and proposal.params.get(str(region.get("param"))) == region.get("value")
        for region in regions
    )


def spent_candidates(history: History, campaign: Campaign) -> int:
    """Candidates that count against the budget: all proposed but the deduplicated."""
    return sum(
        1 for c in history.campaign_candidates(campaign.started.campaign_id) if c.duplicate is None
    )


def _finish_reason(history: History, campaign: Campaign) -> str | None:
    spec = campaign.spec
    spent = spent_candidates(history, campaign)
    if spent >= spec.budget.candidates:
        return f"budget reached: {spent} candidates"
    elapsed = time.time() - campaign.started.ts.timestamp()
    if elapsed >= spec.budget.wall_seconds():
        return f"wall time reached: {elapsed:.0f} s"
    best = history.best(campaign.started.campaign_id)
    if best and best.benchmark and best.benchmark.roofline_fraction >= spec.budget.stop_at_roofline:
        return (
            f"roofline target reached: {best.benchmark.roofline_fraction:.0%} "
            f">= {spec.budget.stop_at_roofline:.0%}"
        )
    return None


def summary(history: History, campaign: Campaign) -> dict[str, Any]:
    campaign_id = campaign.started.campaign_id
    candidates = history.campaign_candidates(campaign_id)
    best = history.best(campaign_id)
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
