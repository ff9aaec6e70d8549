"""What the event history says about every campaign: a projection rebuilt by replay.

The librarian, the planner and the progress display all build this from the same
events, so none of them keeps a truth of its own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec

from actors.campaign import CampaignSpec, decode_config
from actors.ranking import best_of
from eventstore.events import (
    BenchmarkCompleted,
    CampaignFinished,
    CampaignResumed,
    CampaignStarted,
    CandidateDeduplicated,
    CandidateProposed,
    Event,
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
        GenerationOpened,
        CandidateProposed,
        KernelWritten,
        CandidateDeduplicated,
        KernelCompiled,
        KernelVerified,
        KernelRejected,
        BenchmarkCompleted,
        LessonLearned,
        GenerationClosed,
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

    @property
    def candidate_id(self) -> str:
        return self.proposal.candidate_id

    @property
    def settled(self) -> bool:
        return bool(self.rejected or self.benchmark or self.duplicate)

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
        self.event_ids: set[str] = set()

    def apply(self, position: int, event: Event) -> None:
        """Apply one event; replaying an event already applied changes nothing."""
        if position <= self.position or event.event_id in self.event_ids:
            return
        self.position = position
        self.event_ids.add(event.event_id)
        campaign = self.campaigns.get(event.campaign_id)
        if isinstance(event, CampaignStarted):
            self.campaigns[event.campaign_id] = Campaign(event, decode_config(event.config))
            return
        if campaign is None:
            return
        if isinstance(event, CampaignFinished):
            campaign.finished = event
        elif isinstance(event, GenerationOpened):
            campaign.generations.setdefault(event.generation, Generation(event))
        elif isinstance(event, GenerationClosed):
            generation = campaign.generations.get(event.generation)
            if generation is not None:
                generation.closed = event
        elif isinstance(event, LessonLearned):
            campaign.lessons.append(event)
        elif isinstance(event, CandidateProposed):
            if event.candidate_id not in self.candidates:
                self.candidates[event.candidate_id] = Candidate(event)
                generation = campaign.generations.get(event.generation)
                if generation is not None:
                    generation.candidates.append(event.candidate_id)
                self._by_key.setdefault((campaign.scope, event.param_key), event.candidate_id)
        else:
            self._apply_outcome(campaign, event)

    def _apply_outcome(self, campaign: Campaign, event: Event) -> None:
        candidate = self.candidates.get(getattr(event, "candidate_id", ""))
        if candidate is None:
            return
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
        """The incumbent: promoted only by a head-to-head win (`actors.ranking`)."""
        return best_of(self.campaign_candidates(campaign_id))

    def generation_settled(self, campaign_id: str, generation: int) -> bool:
        state = self.campaigns[campaign_id].generations.get(generation)
        if state is None or len(state.candidates) < state.opened.planned:
            return False
        return all(self.candidates[cid].settled for cid in state.candidates)

    def rejections_by_stage(self, campaign_id: str) -> dict[str, int]:
        return dict(
            Counter(c.rejected.stage for c in self.campaign_candidates(campaign_id) if c.rejected)
        )
