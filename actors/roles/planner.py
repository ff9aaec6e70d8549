"""The planner: runs a campaign's lifecycle and proposes each generation's candidates.

On CampaignStarted it opens generation 0; on GenerationClosed it either ends the
campaign's search (budget, wall time, the roofline target, or nothing left to try) or
opens the next generation. A search that ends asks for a final run
(`FinalRunRequested`): the top `search.final_contenders` kernels by the ranking then (4
by default) timed together by the benchmarker; on its result (`FinalRankingTimed`, or
`FinalRunRefused`) the campaign finishes, with the reason the search ended. Fewer than two
timed kernels need no final run: the campaign finishes at once. A final run that gives no
result within `FINAL_RUN_PATIENCE_S` (no benchmarker took it) does not hold the campaign:
it finishes, saying so. On CampaignResumed it continues a campaign whose last generation was
closed (work in flight resumes by itself: the bus redelivers it). A CampaignResumed with
`end_search` (`kfactory best --final-run`: a final answer is asked for) ends the search
at once instead, and asks for a final run of the current top N unless the campaign's
latest final run timed them all (`actors.campaign.final_answer`); a campaign that had
finished, or whose final run was of an older top N, gets another request, its id derived
from that CampaignResumed, and the campaign is not finished twice. A generation is
filled by the campaign's search strategy, looked up by its `writer.kind` in
`actors.search.registry` (the template search, or LLM variations); for strategies that
propose points of the design spaces the librarian is asked which points were already
evaluated, and lessons marking regions to avoid are honoured (those drawn under the
significance rule and not since said otherwise: `lessons.regions_to_avoid`).

Every decision is a pure function of the history, the incoming event and plain inputs
(`decide_planner`, `decide_deadline`); `Planner.handle` only gathers those inputs (the
history, the librarian's answers, the design spaces) and retries with what the
librarian knows. The wall time is active time: a deadline watcher finishes a campaign
it drives as soon as that is spent, even mid-generation. A strategy that cannot fill a
generation stalls the campaign instead of failing (`CampaignStalled`: the template search,
kind `no_design_space`, for a problem with no design space).

A candidate's id is `<campaign>:g<generation>:c<index>`, the same on every redelivery and
replay, like the cause-derived ids of its reactions; a campaign's finish takes its id from
its CampaignStarted (`eventstore/ids.py`), so it is stored once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import structlog

from actors.campaign.campaign_file import CampaignSpec
from actors.campaign.final_answer import current_contenders, final_answer
from actors.campaign.history import Campaign, History
from actors.campaign.replayer import HistoryReader
from actors.campaign.summary import spent_candidates, summary
from actors.roles.messages import SeenRequest, ask_lessons, ask_seen
from actors.runtime import Actor, Reactions
from actors.search.lessons import regions_to_avoid
from actors.search.registry import strategy_for
from actors.search.spaces import design_spaces
from actors.search.strategy import GenerationInputs, Planned, Stalled, Strategy
from actors.search.template_search import Proposal, Space
from bus.connection import Client, id_key, jetstream
from eventstore.emitter import Emitter
from eventstore.events import (
    ActorRef,
    CampaignFinished,
    CampaignResumed,
    CampaignStalled,
    CampaignStarted,
    CandidateProposed,
    Event,
    FinalRankingTimed,
    FinalRunRefused,
    FinalRunRequested,
    GenerationClosed,
    GenerationOpened,
)
from kernels.loading import ProblemLoadError

log = structlog.get_logger("actors.roles.planner")


#: How often the planner looks at its campaigns' wall-time deadlines.
DEADLINE_TICK_S = 1.0
WALL_TIME_REASON = "budget reached: wall time"
#: How long a requested final run may take to report before the campaign finishes without.
FINAL_RUN_PATIENCE_S = 300.0
#: Why the search ended when a final answer was asked for before anything else ended it.
FINAL_ANSWER_REASON = "final answer asked for by kfactory best"


class Planner(Actor):
    role = "planner"
    reacts_to = (
        CampaignStarted,
        CampaignResumed,
        GenerationClosed,
        FinalRankingTimed,
        FinalRunRefused,
    )

    def __init__(self) -> None:
        self._nc: Client | None = None
        self._reader: HistoryReader | None = None
        self._ref: ActorRef | None = None
        self._id_key = b""
        self._watched: set[str] = set()
        self._watcher: asyncio.Task[None] | None = None

    async def setup(self, nc: Client, ref: ActorRef) -> None:
        self._nc = nc
        self._ref = ref
        self._id_key = id_key(nc)
        self._reader = HistoryReader(nc)
        self._watcher = asyncio.create_task(self._watch_deadlines(Emitter(jetstream(nc))))

    async def teardown(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher

    async def handle(self, event: Event, out: Reactions) -> None:
        assert self._reader is not None and self._nc is not None, "setup() runs first"
        history = await self._reader.catch_up(event.event_id)
        now = datetime.now(UTC)
        generation = generation_to_open(history, event, now)
        self._watched.add(event.campaign_id)
        if generation is None:
            decide_planner(history, event, out, now=now)
            return
        campaign = history.campaigns[event.campaign_id]
        campaign_id = campaign.started.campaign_id
        strategy = strategy_for(campaign.spec)
        spaces, first_points = await asyncio.to_thread(
            _spaces_and_first_points, strategy, campaign.spec, campaign_id
        )
        if not strategy.needs_known(generation, spaces):
            decide_planner(history, event, out, now=now, spaces=spaces)
            return
        lessons = await ask_lessons(self._nc, campaign_id)
        avoid = regions_to_avoid(lesson.data for lesson in lessons)
        spec = campaign.spec
        scope = history.scope_candidates(spec.problem, spec.target, spec.dtype)
        known = await self._seen(campaign_id, [c.proposal.param_key for c in scope])
        # The librarian has the last word on what was evaluated (other planners may race):
        # decide again without the points it knows, until it knows none of those proposed.
        for _ in range(3):
            out.events.clear()
            await self._reader.off_loop(  # a search of many points takes seconds
                functools.partial(
                    decide_planner,
                    event=event,
                    out=out,
                    now=now,
                    spaces=spaces,
                    first_points=first_points,
                    known=known,
                    avoid=avoid,
                )
            )
            keys = [e.param_key for e in out.events if isinstance(e, CandidateProposed)]
            fresh = await self._seen(campaign_id, keys) if keys else set()
            if not fresh:
                return
            known |= fresh
        raise RuntimeError("the librarian keeps knowing the proposed points; retrying")

    async def _seen(self, campaign_id: str, keys: list[str]) -> set[str]:
        assert self._nc is not None
        reply = await ask_seen(self._nc, SeenRequest(campaign_id, keys))
        return {key for key, owner in reply.keys.items() if owner is not None}

    async def _watch_deadlines(self, emitter: Emitter) -> None:
        """Finish the campaigns this planner drives once their wall time is spent, even in
        the middle of a generation (the bus has no clock of its own)."""
        assert self._reader is not None and self._ref is not None
        while True:
            await asyncio.sleep(DEADLINE_TICK_S)
            if not self._watched:
                continue
            try:
                history = await self._reader.catch_up()
                now = datetime.now(UTC)
                for campaign_id in list(self._watched):
                    campaign = history.campaigns.get(campaign_id)
                    if campaign is None or campaign.finished is not None:
                        self._watched.discard(campaign_id)
                        continue
                    if campaign.stalled is not None:
                        continue  # nothing runs; a resume starts a new active period
                    out = Reactions(campaign.started, self._ref, self._id_key)
                    decide_deadline(history, campaign_id, out, now=now)
                    if out.events:
                        await emitter.emit_many(out.events)
            except Exception as exc:  # the store or the bus is away: look again next tick
                log.warning("could not check the deadlines", error=str(exc))


def _spaces_and_first_points(
    strategy: Strategy, spec: CampaignSpec, campaign_id: str
) -> tuple[list[Space], list[Proposal]]:
    """The campaign's design spaces and the first points its strategy starts from; none
    when the problem's space cannot be loaded."""
    try:
        spaces = design_spaces(spec.problem, spec.target, spec.dtype, spec)
        first_points = strategy.first_points(spec)
    except (ProblemLoadError, OSError, ValueError) as exc:
        log.warning("no design space", campaign=campaign_id, error=str(exc))
        return [], []
    return list(spaces), list(first_points)


# --- decisions: pure functions of the history and the incoming event -----------------


def generation_to_open(history: History, event: Event, now: datetime) -> int | None:
    """The generation this event opens, or None if it opens none."""
    campaign = history.campaigns.get(event.campaign_id)
    if campaign is None or campaign.finished is not None or campaign.final_requested:
        return None
    if isinstance(event, CampaignResumed) and event.end_search:
        return None
    if not campaign.generations:
        return 0 if active_wall_left(campaign, now) else None
    last = max(campaign.generations)
    state = campaign.generations[last]
    if state.closed is None:
        return None  # in flight: the bus redelivers what was not finished
    if isinstance(event, GenerationClosed) and (
        event.generation != last or _all_dead_lettered(history, state.candidates)
    ):
        return None  # (all dead-lettered: the librarian said it stalled; a resume tries again)
    if _finish_reason(history, campaign, now) is not None:
        return None
    return last + 1


def decide_planner(
    history: History,
    event: Event,
    out: Reactions,
    *,
    now: datetime,
    spaces: Sequence[Space] = (),
    first_points: Sequence[Proposal] = (),
    known: set[str] | frozenset[str] = frozenset(),
    avoid: Sequence[dict[str, Any]] = (),
) -> None:
    """React to CampaignStarted, CampaignResumed, GenerationClosed or a final run's
    result: open a generation (with `spaces` searched, `known` keys and `avoid` regions
    skipped), end the search, finish the campaign, say it stalled, or do nothing."""
    campaign = history.campaigns.get(event.campaign_id)
    if campaign is not None and isinstance(event, CampaignResumed) and event.end_search:
        answer_asked(history, campaign, event, out, now=now)
        return
    if campaign is None or campaign.finished is not None:
        return
    if campaign.final_requested is not None:
        if campaign.final_run is not None:
            finish(history, campaign, campaign.final_requested.reason, out)
        return
    generation = generation_to_open(history, event, now)
    if generation is not None:
        _open(history, campaign, generation, out, spaces, first_points, known, avoid)
        return
    if not campaign.generations:
        decide_deadline(history, event.campaign_id, out, now=now)
        return
    last = max(campaign.generations)
    state = campaign.generations[last]
    if state.closed is None:
        return
    if isinstance(event, GenerationClosed) and event.generation != last:
        return
    reason = _finish_reason(history, campaign, now)
    if reason is not None:
        end_search(history, campaign, reason, out)


def decide_deadline(history: History, campaign_id: str, out: Reactions, *, now: datetime) -> None:
    """End the campaign's search if its wall time (active time) is spent; finish it if its
    final run reported, or gave no result within `FINAL_RUN_PATIENCE_S`."""
    campaign = history.campaigns.get(campaign_id)
    if campaign is None or campaign.finished is not None:
        return
    requested = campaign.final_requested
    if requested is not None:
        waited = (now - requested.ts).total_seconds()
        if campaign.final_run is not None:
            finish(history, campaign, requested.reason, out)
        elif waited > FINAL_RUN_PATIENCE_S:
            late = f"; no final run result within {FINAL_RUN_PATIENCE_S:g} s"
            finish(history, campaign, requested.reason + late, out)
        return
    if not active_wall_left(campaign, now):
        end_search(history, campaign, WALL_TIME_REASON, out)


def end_search(history: History, campaign: Campaign, reason: str, out: Reactions) -> None:
    """The search is over: ask for the final run of the top kernels (one request per
    campaign, whichever decision reaches it first), or finish at once when fewer than two
    were timed."""
    if campaign.final_requested is not None:
        return
    contenders = current_contenders(history, campaign.started.campaign_id)
    if len(contenders) < 2:
        finish(history, campaign, reason, out)
        return
    _request_final(campaign, contenders, reason, campaign.started.event_id, out)


def answer_asked(
    history: History, campaign: Campaign, event: CampaignResumed, out: Reactions, *, now: datetime
) -> None:
    """A final answer was asked for (`event.end_search`): end the search now, or, where it
    has ended, ask for another final run when the latest did not time the current top N
    (its id derived from `event`, so a redelivery asks once); finish a campaign whose
    final run has answered and that did not finish yet."""
    if campaign.finished is None and campaign.final_requested is None:
        end_search(
            history, campaign, _finish_reason(history, campaign, now) or FINAL_ANSWER_REASON, out
        )
        return
    answer = final_answer(history, campaign.started.campaign_id)
    requested = campaign.final_requested
    if not answer.final:
        ended = requested.reason if requested and campaign.finished is None else None
        _request_final(
            campaign, answer.contenders, ended or FINAL_ANSWER_REASON, event.event_id, out
        )
    elif campaign.finished is None and requested is not None and campaign.final_run is not None:
        finish(history, campaign, requested.reason, out)


def _request_final(
    campaign: Campaign, contenders: list[str], reason: str, derived_from: str, out: Reactions
) -> None:
    spec = campaign.spec
    out.emit(
        FinalRunRequested,
        campaign_id=campaign.started.campaign_id,
        event_id=out.derived_id(derived_from, "final-run"),
        problem=spec.problem,
        target=spec.target,
        dtype=spec.dtype,
        contenders=contenders,
        reason=reason,
    )


def finish(history: History, campaign: Campaign, reason: str, out: Reactions) -> None:
    """One CampaignFinished per campaign, whichever decision reaches it first."""
    out.emit(
        CampaignFinished,
        campaign_id=campaign.started.campaign_id,
        event_id=out.derived_id(campaign.started.event_id, "finished"),
        reason=reason,
        summary=summary(history, campaign),
    )


def active_wall_left(campaign: Campaign, now: datetime) -> bool:
    return campaign.active_seconds(now) < campaign.spec.budget.wall_seconds()


def _all_dead_lettered(history: History, candidate_ids: list[str]) -> bool:
    candidates = [history.candidates[cid] for cid in candidate_ids]
    counted = [c for c in candidates if not c.duplicate]
    return bool(counted) and all(c.failed_undelivered for c in counted)


def _open(
    history: History,
    campaign: Campaign,
    generation: int,
    out: Reactions,
    spaces: Sequence[Space],
    first_points: Sequence[Proposal],
    known: set[str] | frozenset[str],
    avoid: Sequence[dict[str, Any]],
) -> None:
    spec = campaign.spec
    remaining = spec.budget.candidates - spent_candidates(history, campaign)
    inputs = GenerationInputs(
        min(spec.search.per_generation, remaining), spaces, first_points, known, avoid
    )
    filled = strategy_for(spec).fill(history, campaign, generation, inputs)
    if isinstance(filled, Stalled):
        out.emit(CampaignStalled, kind=filled.kind, detail=filled.detail)
        return
    _propose(history, campaign, generation, filled.candidates, filled.reason_if_none, out)


def _propose(
    history: History,
    campaign: Campaign,
    generation: int,
    candidates: list[Planned],
    reason_if_none: str,
    out: Reactions,
) -> None:
    """Open the generation with these candidates, or end the search if there are none."""
    if not candidates:
        end_search(history, campaign, reason_if_none, out)
        return
    spec = campaign.spec
    campaign_id = campaign.started.campaign_id
    out.emit(GenerationOpened, generation=generation, planned=len(candidates))
    for index, planned in enumerate(candidates):
        out.emit(
            CandidateProposed,
            problem=spec.problem,
            target=spec.target,
            dtype=spec.dtype,
            candidate_id=f"{campaign_id}:g{generation}:c{index}",
            generation=generation,
            template=planned.template,
            params=planned.params,
            param_key=planned.param_key,
            operator=planned.operator,
            parents=planned.parents,
        )


def _finish_reason(history: History, campaign: Campaign, now: datetime) -> str | None:
    spec = campaign.spec
    spent = spent_candidates(history, campaign)
    if spent >= spec.budget.candidates:
        return f"budget reached: {spent} candidates"
    if not active_wall_left(campaign, now):
        return WALL_TIME_REASON
    best = history.best(campaign.started.campaign_id)
    if best and best.benchmark and best.benchmark.roofline_fraction >= spec.budget.stop_at_roofline:
        return (
            f"roofline target reached: {best.benchmark.roofline_fraction:.0%} "
            f">= {spec.budget.stop_at_roofline:.0%}"
        )
    return None
