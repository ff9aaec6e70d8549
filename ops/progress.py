"""What `kfactory run` shows while a campaign runs: its progress, and which roles it
needs have no live instance.

`Progress` applies the campaign's events as they arrive to a `History` of its own. On a
terminal it is a live table; otherwise a line every `LINE_EVERY` (10 s): the generation,
candidates settled of those proposed (and the budget), verified, benchmarking, those
waiting for a device worker to join (a cuda campaign on a host without a GPU), the best
so far (its figure from the leaderboard: the median of its own timing run and its speedup
over the baseline timed in that run, and the operator behind it: `by omp_simd of
g1:c0`), the time elapsed and an ETA at the pace so far. `stalled` is the blocking
CampaignStalled recorded since this run's start or resume, which ends the run.
`LiveActors` tracks, from heartbeats, when each needed role was last heard from: one
unheard for `bus.heartbeat.LIVE_FOR` (15 s) is missing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from rich.table import Table

from actors.campaign.history import Candidate, History
from actors.campaign.leaderboard import campaign_leaderboard
from actors.campaign.ranking import short_id
from bus.connection import Client
from bus.follow import Msg
from bus.heartbeat import LIVE_FOR, Heartbeat
from bus.publisher import msg_id
from eventstore.admission import admit
from eventstore.causality import CHECKED_TYPES
from eventstore.codec import InvalidEvent
from eventstore.events import CampaignStalled, Event
from eventstore.queries import stored_or_refused

#: Without a terminal, a progress line this often.
LINE_EVERY = 10.0


class Progress:
    """The campaign's events as they arrive, applied to a history of its own."""

    def __init__(self, history: History, campaign_id: str, store: Client | None = None) -> None:
        self.history = history
        self.campaign_id = campaign_id
        self.started = time.monotonic()
        #: Where to ask whether the recorder stored a benchmark (it may refuse one by what
        #: was recorded before it, which admission cannot tell); None: a replayed log.
        self.store = store

    async def on_message(self, message: Msg) -> None:
        try:
            event = admit(message.subject, message.data, msg_id(message)).event
        except InvalidEvent:  # the recorder refuses it too (an EventRejected)
            return
        if self.store is not None and event.type in CHECKED_TYPES:
            sequence = message.metadata.sequence.stream
            if not await stored_or_refused(self.store, event.event_id, sequence, 30.0):
                return  # refused by the recorder's causality rule (an EventRejected)
        self.history.apply(self.history.position + 1, event)

    def stalled(self, start: Event) -> CampaignStalled | None:
        """Why the campaign cannot go on, if it said so after `start` (this run's start or
        resume): the run then ends and says why."""
        campaign = self.history.campaigns.get(self.campaign_id)
        if campaign is None or campaign.finished or start.event_id not in self.history.event_ids:
            return None
        return campaign.stalled

    @property
    def finished(self) -> bool:
        campaign = self.history.campaigns.get(self.campaign_id)
        return campaign is not None and campaign.finished is not None

    def counts(self) -> Counts:
        campaign = self.history.campaigns.get(self.campaign_id)
        candidates = self.history.campaign_candidates(self.campaign_id)
        settled = sum(c.settled for c in candidates)
        budget = campaign.spec.budget.candidates if campaign else 0
        best = campaign_leaderboard(self.history, self.campaign_id).best if campaign else None
        elapsed = time.monotonic() - self.started
        left = max(budget - settled, 0)
        return Counts(
            generation=max(campaign.generations, default=0) if campaign else 0,
            proposed=len(candidates),
            settled=settled,
            budget=budget,
            verified=sum(bool(c.verified) for c in candidates),
            benchmarking=sum(bool(c.verified and not c.settled) for c in candidates),
            waiting_for_device=sum(c.waiting_for_device for c in candidates),
            best_median_ns=best.median_ns if best else None,
            best_speedup=best.speedup if best else None,
            best_by=_made_by(best.candidate) if best else "",
            elapsed_s=elapsed,
            eta_s=elapsed / settled * left if settled and left else None,
        )

    def line(self) -> str:
        c = self.counts()
        waiting = f"waiting for the device {c.waiting_for_device}, " if c.waiting_for_device else ""
        return (
            f"campaign {self.campaign_id}: generation {c.generation}, "
            f"settled {c.settled} of {c.proposed} proposed (budget {c.budget}), "
            f"verified {c.verified}, benchmarking {c.benchmarking}, {waiting}"
            f"best {c.best}, elapsed {_duration(c.elapsed_s)}, ETA {c.eta}"
        )

    def table(self) -> Table:
        table = Table(title=f"campaign {self.campaign_id}", show_header=False)
        campaign = self.history.campaigns.get(self.campaign_id)
        if campaign is None:
            table.add_row("starting", "")
            return table
        c = self.counts()
        table.add_row("generation", str(c.generation))
        table.add_row(
            "candidates settled", f"{c.settled} of {c.proposed} proposed (budget {c.budget})"
        )
        table.add_row("verified / benchmarking", f"{c.verified} / {c.benchmarking}")
        if c.waiting_for_device:
            table.add_row(
                "waiting for the device",
                f"{c.waiting_for_device} compiled and checked, not yet run on a "
                f"{campaign.spec.target} worker",
            )
        table.add_row("best (median, speedup over the baseline in its run)", c.best)
        rejected = self.history.rejections_by_stage(self.campaign_id)
        table.add_row(
            "rejected by stage", ", ".join(f"{k} {v}" for k, v in rejected.items()) or "-"
        )
        table.add_row("elapsed", _duration(c.elapsed_s))
        table.add_row("ETA", c.eta)
        return table


@dataclass(frozen=True)
class Counts:
    """Where a campaign stands: generation, candidates by state, best so far, time."""

    generation: int
    proposed: int
    settled: int
    budget: int
    verified: int
    benchmarking: int
    waiting_for_device: int
    best_median_ns: float | None
    """The best's figure (`Row.median_ns`, `Row.speedup`): both move only when another
    kernel is promoted."""
    best_speedup: float | None
    best_by: str
    """What made the best: the variation operator (or LLM operator) behind it; empty for
    a template's point or a seed as it is."""
    elapsed_s: float
    eta_s: float | None
    """At the pace so far, until the candidate budget is spent (None: no pace yet)."""

    @property
    def best(self) -> str:
        if self.best_median_ns is None:
            return "-"
        speedup = f" ({self.best_speedup:.2f}x)" if self.best_speedup else ""
        by = f" by {self.best_by}" if self.best_by else ""
        return f"{self.best_median_ns / 1e6:.3f} ms{speedup}{by}"

    @property
    def eta(self) -> str:
        return _duration(self.eta_s) if self.eta_s is not None else "-"


def _made_by(candidate: Candidate) -> str:
    """The operator behind a kernel and the parent it varied (`omp_simd of g1:c0`)."""
    proposal = candidate.proposal
    if proposal.operator == "sample" or not proposal.parents:
        return ""
    return f"{proposal.operator} of {', '.join(short_id(p) for p in proposal.parents)}"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class LiveActors:
    """The roles a campaign needs, and when each was last heard from."""

    def __init__(self, needed: Iterable[tuple[str, str | None]]) -> None:
        """`needed`: (role, target) pairs; target None for roles that serve any target."""
        self.needed = list(needed)
        self.live_for = LIVE_FOR
        self.since = time.monotonic()
        self.last_seen: dict[tuple[str, str | None], float] = {}
        self.reported: set[str] = set()

    async def seen(self, beat: Heartbeat, _received: float) -> None:
        for role, target in self.needed:
            if beat.role == role and (target is None or beat.target == target):
                self.last_seen[(role, target)] = time.monotonic()

    def missing(self) -> list[str]:
        """Needed roles not heard from for `live_for` s (counted from when we began)."""
        now = time.monotonic()
        return [
            role
            for role, target in self.needed
            if now - self.last_seen.get((role, target), self.since) > self.live_for
        ]

    def newly_missing(self) -> tuple[list[str], list[str]]:
        """Roles missing that were not reported yet, and roles back since reported."""
        missing = set(self.missing())
        new = sorted(missing - self.reported)
        back = sorted(self.reported - missing)
        self.reported = missing
        return new, back
