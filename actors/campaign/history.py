"""What the event history says about every campaign: a projection rebuilt by replay.

The librarian, the planner and the progress display all build this from the same
events, so none of them keeps a truth of its own. Every role keeps one current by
replaying the store (`actors/campaign/replayer.py`); `actors/records/story.py` applies a
campaign's events to a fresh one, up to any position or time.

- `apply` ignores an event it has already applied (by position and id), so a replay and
  a live stream may overlap.
- A candidate keeps its first outcome: a later rejection or benchmark of it (a late
  result of a worker presumed dead) changes nothing. A DeadLettered message settles a
  candidate that has no outcome yet as failed.
- The dedupe index is per scope (problem, target, shapes, dtype), across campaigns:
  candidates by normalised parameter key (`param_key`, `seen_key`, which answers the
  librarian's `seen`), kernels by the hash of flags plus source (`kernels/identity.py`,
  `seen_source`, with which the writer turns a source another candidate settled into
  CandidateDeduplicated).
- A campaign's active time (`Campaign.active_seconds`, what `budget.wall_time` counts) is
  the time since its start or latest resume plus the time it ran before, up to its last
  event before that resume.
- `best` is the incumbent, promoted only head to head (`actors.campaign.ranking.best_of`).
- A campaign done searching has its `final_requested`, then its `final_run` (the top
  kernels timed together, or why that could not be made), then its `finished`. A final
  answer asked for later (`kfactory best --final-run`) may request another final run, even
  of a finished campaign: `final_requested` is the latest request, `final_run` the answer
  to it (None while it is pending), and `final_ranking` the latest final run timed, which
  the leaderboard follows. A request still unanswered when the campaign finished (no
  benchmarker took it in time) was given up on (`final_given_up`).
- `outcome_log` lists every candidate's outcome events in the order they were applied,
  so a reader that keeps tallies (the lessons' `actors.search.lesson_tally`) catches up
  from where it stopped instead of going over every candidate again.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from actors.campaign.campaign_file import CampaignSpec, decode_config
from actors.campaign.ranking import best_of
from eventstore.admission import acceptable
from eventstore.events import (
    BenchmarkCompleted,
    CampaignFinished,
    CampaignResumed,
    CampaignStalled,
    CampaignStarted,
    CandidateDeduplicated,
    CandidateProposed,
    DeadLettered,
    Event,
    FinalRankingTimed,
    FinalRunRefused,
    FinalRunRequested,
    FusionPlanned,
    GenerationClosed,
    GenerationOpened,
    KernelCompiled,
    KernelRejected,
    KernelVerified,
    KernelWritten,
    LessonLearned,
)

HISTORY_TYPES = [
    cls.__name__
    for cls in (
        CampaignStarted,
        CampaignResumed,
        CampaignFinished,
        CampaignStalled,
        GenerationOpened,
        CandidateProposed,
        FusionPlanned,
        KernelWritten,
        CandidateDeduplicated,
        KernelCompiled,
        KernelVerified,
        KernelRejected,
        BenchmarkCompleted,
        LessonLearned,
        GenerationClosed,
        FinalRunRequested,
        FinalRankingTimed,
        FinalRunRefused,
        DeadLettered,
    )
]


def param_key(template: str, params: dict[str, Any]) -> str:
    """A normalised key of a template and its parameters (order and types fixed)."""
    return template + ":" + msgspec.json.encode(dict(sorted(params.items()))).decode()


@dataclass
class Candidate:
    proposal: CandidateProposed
    written: KernelWritten | None = None
    compiled: KernelCompiled | None = None
    verified: KernelVerified | None = None
    rejected: KernelRejected | None = None
    benchmark: BenchmarkCompleted | None = None
    duplicate: CandidateDeduplicated | None = None
    dead_letter: DeadLettered | None = None
    """A consumer gave up on this candidate's work before any other outcome: it failed."""

    @property
    def candidate_id(self) -> str:
        return self.proposal.candidate_id

    @property
    def settled(self) -> bool:
        return bool(self.rejected or self.benchmark or self.duplicate or self.dead_letter)

    @property
    def failed_undelivered(self) -> bool:
        """Settled only by a dead letter: no stage ever judged its kernel."""
        return bool(self.dead_letter and not (self.rejected or self.benchmark or self.duplicate))

    @property
    def evaluated(self) -> bool:
        """Verification ran on it (a deduplicated candidate was not evaluated)."""
        return bool(self.rejected or self.verified)

    @property
    def waiting_for_device(self) -> bool:
        """Compiled and checked on some host, not yet run on the device."""
        return bool(self.compiled and not (self.rejected or self.verified))

    @property
    def speedup(self) -> float | None:
        return self.benchmark.speedup if self.benchmark else None

    @property
    def outcome_event(self) -> Event | None:
        return self.benchmark or self.rejected or self.duplicate


@dataclass
class Generation:
    opened: GenerationOpened
    candidates: list[str] = field(default_factory=list)
    closed: GenerationClosed | None = None


@dataclass
class Campaign:
    started: CampaignStarted
    spec: CampaignSpec
    generations: dict[int, Generation] = field(default_factory=dict)
    finished: CampaignFinished | None = None
    lessons: list[LessonLearned] = field(default_factory=list)
    said: set[str] = field(default_factory=set)
    """The statements of `lessons` (a lesson is not drawn twice)."""
    stalled: CampaignStalled | None = None
    """Why the campaign cannot go on, until it is resumed or opens a generation."""
    active_before: float = 0.0
    """Seconds the campaign ran before its latest start or resume."""
    segment_start: datetime | None = None
    last_ts: datetime | None = None
    final_requested: FinalRunRequested | None = None
    """The search is over: its top kernels are to be timed together (the latest request)."""
    final_run: FinalRankingTimed | FinalRunRefused | None = None
    """The answer to that request: its final run, or why it could not be made."""
    final_ranking: FinalRankingTimed | None = None
    """The latest final run timed (of any request): the leaderboard's."""
    final_given_up: bool = False
    """The campaign finished while `final_requested` had no answer."""

    def active_seconds(self, now: datetime) -> float:
        """The time the campaign was running: a gap before a resume does not count."""
        start = self.segment_start or self.started.ts
        return self.active_before + max(0.0, (now - start).total_seconds())

    def _touch(self, event: Event) -> None:
        if isinstance(event, CampaignResumed):
            start = self.segment_start or self.started.ts
            if self.last_ts is not None and self.last_ts > start:
                self.active_before += (self.last_ts - start).total_seconds()
            self.segment_start = event.ts
            self.stalled = None
        if self.last_ts is None or event.ts > self.last_ts:
            self.last_ts = event.ts

    @property
    def scope(self) -> tuple[str, str, str, str]:
        """Campaigns with the same scope share a dedupe index."""
        return (self.spec.problem, self.spec.target, repr(self.spec.shapes), self.spec.dtype)


class History:
    def __init__(self) -> None:
        self.position = 0
        self.campaigns: dict[str, Campaign] = {}
        self.candidates: dict[str, Candidate] = {}
        self._by_key: dict[tuple[tuple[str, str, str, str], str], str] = {}
        self._by_hash: dict[tuple[tuple[str, str, str, str], str], str] = {}
        self._candidate_of: dict[str, str] = {}  # a candidate's work event id -> candidate id
        self.event_ids: set[str] = set()
        self.outcome_log: list[tuple[Candidate, Event]] = []
        """Each event applied to a proposed candidate (kernel, verdict, timing), in order."""

    def apply(self, position: int, event: Event) -> None:
        """Apply one event; replaying an event already applied changes nothing."""
        if position <= self.position or event.event_id in self.event_ids:
            return
        self.position = position
        self.event_ids.add(event.event_id)
        if not acceptable(event):  # the recorder's rule (a store older than it may hold some)
            return
        campaign = self.campaigns.get(event.campaign_id)
        if isinstance(event, CampaignStarted):
            self.campaigns[event.campaign_id] = Campaign(event, decode_config(event.config))
            return
        if campaign is None:
            return
        campaign._touch(event)
        if isinstance(event, CampaignFinished):
            campaign.finished = event
            campaign.final_given_up = bool(campaign.final_requested and not campaign.final_run)
        elif isinstance(event, CampaignStalled) and event.blocks:
            campaign.stalled = event
        elif isinstance(event, DeadLettered):
            self._apply_dead_letter(event)
        elif isinstance(event, GenerationOpened):
            campaign.stalled = None
            campaign.generations.setdefault(event.generation, Generation(event))
        elif isinstance(event, GenerationClosed):
            generation = campaign.generations.get(event.generation)
            if generation is not None:
                generation.closed = event
        elif isinstance(event, FinalRunRequested):
            campaign.final_requested, campaign.final_run = event, None
            campaign.final_given_up = False
        elif isinstance(event, FinalRankingTimed | FinalRunRefused):
            self._apply_final_run(campaign, event)
        elif isinstance(event, LessonLearned):
            campaign.lessons.append(event)
            campaign.said.add(event.statement)
        elif isinstance(event, CandidateProposed):
            if event.candidate_id not in self.candidates:
                self.candidates[event.candidate_id] = Candidate(event)
                generation = campaign.generations.get(event.generation)
                if generation is not None:
                    generation.candidates.append(event.candidate_id)
                self._by_key.setdefault((campaign.scope, event.param_key), event.candidate_id)
                self._candidate_of[event.event_id] = event.candidate_id
        else:
            self._apply_outcome(campaign, event)

    @staticmethod
    def _apply_final_run(campaign: Campaign, event: FinalRankingTimed | FinalRunRefused) -> None:
        requested = campaign.final_requested
        answers = requested is not None and event.causation_id == requested.event_id
        if answers and campaign.final_run is None:
            campaign.final_run = event
        if isinstance(event, FinalRankingTimed):
            campaign.final_ranking = event

    def _apply_dead_letter(self, event: DeadLettered) -> None:
        candidate = self.candidate_of(event.original_event_id or "")
        if candidate is not None and not candidate.settled:
            candidate.dead_letter = event

    def _apply_outcome(self, campaign: Campaign, event: Event) -> None:
        candidate = self.candidates.get(getattr(event, "candidate_id", ""))
        if candidate is None:
            return
        self._candidate_of[event.event_id] = candidate.candidate_id
        self.outcome_log.append((candidate, event))
        if isinstance(event, KernelWritten):
            candidate.written = event
            self._by_hash.setdefault((campaign.scope, event.source_hash), candidate.candidate_id)
        elif isinstance(event, KernelCompiled):
            candidate.compiled = event
        elif isinstance(event, KernelVerified):
            candidate.verified = event
        elif isinstance(event, KernelRejected) and candidate.rejected is None:
            candidate.rejected = event
        elif isinstance(event, BenchmarkCompleted) and candidate.benchmark is None:
            candidate.benchmark = event
        elif isinstance(event, CandidateDeduplicated):
            candidate.duplicate = event

    # --- questions ---------------------------------------------------------------------

    def candidate_of(self, event_id: str) -> Candidate | None:
        """The candidate whose work (proposal, kernel, verdict...) this event is."""
        found = self._candidate_of.get(event_id)
        return self.candidates.get(found) if found else None

    def seen_key(self, campaign_id: str, key: str) -> Candidate | None:
        """The candidate with this parameter key in the campaign's scope, if any."""
        found = self._by_key.get((self.campaigns[campaign_id].scope, key))
        return self.candidates.get(found) if found else None

    def seen_source(self, campaign_id: str, source_hash: str, besides: str) -> Candidate | None:
        """Another candidate in the scope whose kernel has this exact source."""
        found = self._by_hash.get((self.campaigns[campaign_id].scope, source_hash))
        if found is None or found == besides:
            return None
        return self.candidates[found]

    def campaign_candidates(self, campaign_id: str) -> list[Candidate]:
        campaign = self.campaigns[campaign_id]
        return [
            self.candidates[cid]
            for generation in sorted(campaign.generations)
            for cid in campaign.generations[generation].candidates
        ]

    def scope_candidates(self, problem: str, target: str, dtype: str) -> list[Candidate]:
        """Every candidate ever proposed for this problem, target and dtype, any campaign."""
        return [
            c
            for c in self.candidates.values()
            if (c.proposal.problem, c.proposal.target, c.proposal.dtype) == (problem, target, dtype)
        ]

    def best(self, campaign_id: str) -> Candidate | None:
        """The incumbent: promoted only by a head-to-head win (`actors.campaign.ranking`)."""
        return best_of(self.campaign_candidates(campaign_id))

    def generation_settled(self, campaign_id: str, generation: int) -> bool:
        state = self.campaigns[campaign_id].generations.get(generation)
        if state is None or len(state.candidates) < state.opened.planned:
            return False
        return all(self.candidates[cid].settled for cid in state.candidates)

    def rejections_by_stage(self, campaign_id: str) -> dict[str, int]:
        """Rejections per stage; candidates whose work was given up on count as `dead_letter`."""
        return dict(
            Counter(
                c.rejected.stage if c.rejected else "dead_letter"
                for c in self.campaign_candidates(campaign_id)
                if c.rejected or c.failed_undelivered
            )
        )
