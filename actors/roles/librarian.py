"""The librarian: closes generations with lessons, and answers what is known.

It keeps the history of every campaign by replaying the store. When every candidate of
a generation is settled (a candidate whose work was dead-lettered settles as failed) it
emits the lessons drawn from the history (each citing its evidence) and
GenerationClosed; if every candidate was dead-lettered, also CampaignStalled. That
decision is the pure `decide_librarian`. Over request/reply (`kf.svc.kf-librarian.*`) it answers
the dedupe questions (`seen`), the lessons of a problem and target (`lessons`), and
the kernels of candidates (`kernel`, `best`).
"""

from __future__ import annotations

import msgspec

from actors.campaign.history import Candidate, History
from actors.campaign.ranking import best_of
from actors.campaign.replayer import HistoryReader
from actors.roles.messages import (
    SERVICE,
    KernelReply,
    KernelRequest,
    LessonsRequest,
    LessonView,
    SeenReply,
    SeenRequest,
)
from actors.runtime import Actor, Reactions
from actors.search.lessons import draw_lessons
from bus.connection import Client
from bus.service import RequestRefused, Service, asked, serve
from eventstore.events import (
    ActorRef,
    BenchmarkCompleted,
    CampaignStalled,
    CandidateDeduplicated,
    DeadLettered,
    Event,
    GenerationClosed,
    GenerationOpened,
    KernelRejected,
    LessonLearned,
)


class Librarian(Actor):
    role = "librarian"
    reacts_to = (
        GenerationOpened,
        CandidateDeduplicated,
        KernelRejected,
        BenchmarkCompleted,
        DeadLettered,
    )

    def __init__(self) -> None:
        self._reader: HistoryReader | None = None
        self._service: Service | None = None

    async def setup(self, nc: Client, ref: ActorRef) -> None:
        self._reader = HistoryReader(nc)
        self._service = await serve(
            nc,
            SERVICE,
            "1.0.0",
            {"seen": self._seen, "kernel": self._kernel, "lessons": self._lessons},
            description="dedupe index, lessons and kernels of the search history",
        )

    async def teardown(self) -> None:
        if self._service is not None:
            await self._service.stop()

    async def _history(self, until: str | None = None) -> History:
        assert self._reader is not None, "setup() runs first"
        return await self._reader.catch_up(until)

    async def handle(self, event: Event, out: Reactions) -> None:
        decide_librarian(await self._history(event.event_id), event, out)

    # --- answers -----------------------------------------------------------------------

    async def _seen(self, data: bytes) -> bytes:
        ask = asked(data, SeenRequest)
        history = await self._history()
        if ask.campaign_id not in history.campaigns:
            raise RequestRefused(f"unknown campaign {ask.campaign_id!r}")
        keys = {}
        for key in ask.param_keys:
            found = history.seen_key(ask.campaign_id, key)
            keys[key] = found.candidate_id if found else None
        duplicate_of = None
        if ask.source_hash:
            earlier = history.seen_source(ask.campaign_id, ask.source_hash, ask.candidate_id)
            if earlier is not None and earlier.outcome_event is not None:
                duplicate_of = earlier.outcome_event.event_id
        return msgspec.json.encode(SeenReply(keys, duplicate_of))

    async def _kernel(self, data: bytes) -> bytes:
        ask = asked(data, KernelRequest)
        history = await self._history()
        if ask.campaign_id not in history.campaigns:
            raise RequestRefused(f"unknown campaign {ask.campaign_id!r}")
        candidate: Candidate | None
        if ask.candidate_id is None:
            candidate = history.best(ask.campaign_id)
        else:
            candidate = history.candidates.get(ask.candidate_id)
        if candidate is None or candidate.written is None:
            return b"null"
        rejection = None
        if candidate.rejected is not None:
            r = candidate.rejected
            rejection = {"stage": r.stage, "reason": r.reason, "evidence": r.evidence}
        written = candidate.written
        return msgspec.json.encode(
            KernelReply(
                candidate.candidate_id, written.source, written.flags, candidate.speedup, rejection
            )
        )

    async def _lessons(self, data: bytes) -> bytes:
        ask = asked(data, LessonsRequest)
        history = await self._history()
        campaign = history.campaigns.get(ask.campaign_id)
        if campaign is None:
            raise RequestRefused(f"unknown campaign {ask.campaign_id!r}")
        related = [
            c
            for c in history.campaigns.values()
            if (c.spec.problem, c.spec.target) == (campaign.spec.problem, campaign.spec.target)
        ]
        views = [
            LessonView(x.kind, x.statement, x.data, x.evidence_ids)
            for c in related
            for x in c.lessons
        ]
        return msgspec.json.encode(views)


# --- decisions: pure functions of the history and the incoming event -----------------


def decide_librarian(history: History, event: Event, out: Reactions) -> None:
    """When the event settles the last candidate of its generation, emit the lessons not
    drawn before and GenerationClosed; a generation whose every candidate's work was
    given up on (dead-lettered) also records that the campaign stalled."""
    campaign = history.campaigns.get(event.campaign_id)
    generation: int | None = getattr(event, "generation", None)
    if isinstance(event, DeadLettered):
        candidate = history.candidate_of(event.original_event_id or "")
        generation = candidate.proposal.generation if candidate else None
    if campaign is None or generation is None:
        return
    state = campaign.generations.get(generation)
    if state is None or state.closed is not None:
        return
    if not history.generation_settled(event.campaign_id, generation):
        return
    opened = state.opened.event_id
    drawn = draw_lessons(history, event.campaign_id)
    fresh = [x for x in drawn if x.statement not in campaign.said]
    for index, lesson in enumerate(fresh):
        out.emit(
            LessonLearned,
            event_id=out.derived_id(opened, "lesson", index),
            generation=generation,
            kind=lesson.kind,
            statement=lesson.statement,
            evidence_ids=lesson.evidence_ids,
            data=lesson.data,
        )
    candidates = [history.candidates[cid] for cid in state.candidates]
    best = best_of(candidates)  # by own time and head to head, as run and replay say
    given_up = [c for c in candidates if c.failed_undelivered]
    counted = [c for c in candidates if not c.duplicate]
    if counted and len(given_up) == len(counted):
        reasons = sorted({c.dead_letter.reason for c in given_up if c.dead_letter})
        consumer = given_up[0].dead_letter.consumer if given_up[0].dead_letter else ""
        out.emit(
            CampaignStalled,
            kind="dead_lettered",
            detail=f"generation {generation}: the work of all {len(given_up)} candidate(s) "
            f"was given up on ({'; '.join(reasons)[:300]}); run the campaign again to resume",
            role=consumer.removeprefix("kf-"),
            event_id=out.derived_id(opened, "stalled"),
        )
    out.emit(
        GenerationClosed,
        event_id=out.derived_id(opened, "closed"),
        generation=generation,
        settled=len(candidates),
        evaluated=sum(1 for c in candidates if c.evaluated),
        best_candidate=best.candidate_id if best else None,
        best_speedup=best.speedup if best else None,
    )
