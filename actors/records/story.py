"""A campaign's story, rebuilt from its events alone: generations and the best so far,
the lessons and what they changed, rejections by stage and reason, and the time each
role spent. `rebuild` applies the events to a fresh `History` and stops at a position
or a moment, so the story can be told as of any point of the campaign (`kfactory
replay`). Each generation names its best so far by the rule `run` and the librarian use
(`actors.campaign.ranking.best_of`); `best` is the campaign's answer as of that point,
the leaderboard's rank 1 (the final run's winner once there is one) with how its rank was
decided; each lesson says what later proposals did with it;
the time per role is the sum of the seconds from each event's cause to it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from actors.campaign.history import Candidate, History
from actors.campaign.leaderboard import campaign_leaderboard, figure_of
from actors.campaign.ranking import RunningBoard, best_of
from actors.campaign.summary import identity
from eventstore.events import CandidateProposed, Event, LessonLearned


class UnknownCampaign(KeyError):
    """No CampaignStarted for this id (before the cut-off, if one was given)."""


@dataclass
class Rebuilt:
    """A campaign's projection and its own events, as of `position`."""

    campaign_id: str
    history: History
    events: list[tuple[int, Event]] = field(default_factory=list)

    @property
    def position(self) -> int:
        return self.events[-1][0] if self.events else 0


def rebuild(
    events: Iterable[tuple[int, Event]],
    campaign_id: str,
    at_position: int | None = None,
    at_time: datetime | None = None,
) -> Rebuilt:
    """Apply events in order up to the cut-off; the campaign's own are kept for the story."""
    history = History()
    own: list[tuple[int, Event]] = []
    for position, event in events:
        if at_position is not None and position > at_position:
            break
        if at_time is not None and event.ts > at_time:
            break
        history.apply(position, event)
        if event.campaign_id == campaign_id:
            own.append((position, event))
    if campaign_id not in history.campaigns:
        when = ""
        if at_position is not None or at_time is not None:
            when = " by then"
        raise UnknownCampaign(f"no campaign {campaign_id!r} in the store{when}")
    return Rebuilt(campaign_id, history, own)


def story(rebuilt: Rebuilt) -> dict[str, Any]:
    """Everything `kfactory replay` prints, as plain data."""
    history, campaign_id = rebuilt.history, rebuilt.campaign_id
    campaign = history.campaigns[campaign_id]
    candidates = history.campaign_candidates(campaign_id)
    first_ts = rebuilt.events[0][1].ts if rebuilt.events else campaign.started.ts
    last_ts = rebuilt.events[-1][1].ts if rebuilt.events else campaign.started.ts
    return {
        **identity(campaign),
        "state": "finished" if campaign.finished else "running",
        "finish_reason": campaign.finished.reason if campaign.finished else None,
        "position": rebuilt.position,
        "events": len(rebuilt.events),
        "started": first_ts.isoformat(),
        "as_of": last_ts.isoformat(),
        "wall_seconds": (last_ts - first_ts).total_seconds(),
        "proposed": len(candidates),
        "evaluated": sum(c.evaluated for c in candidates),
        "duplicates_avoided": sum(1 for c in candidates if c.duplicate),
        "generations": generations(history, campaign_id),
        "best": best_answer(history, campaign_id),
        "lessons": lessons(history, campaign_id),
        "rejections": rejections(candidates),
        "actors": time_per_actor(rebuilt.events),
    }


def best_answer(history: History, campaign_id: str) -> dict[str, Any] | None:
    """The campaign's best as its leaderboard answers (rank 1: the final run's winner once
    there is one, else the last kernel promoted head to head): its figure and how its rank
    was decided; None before a kernel was promoted."""
    best = campaign_leaderboard(history, campaign_id).best
    if best is None or best.candidate.benchmark is None:
        return None
    figure = figure_of(best.candidate.benchmark)
    return {
        "candidate_id": best.candidate_id,
        "speedup": figure.speedup,
        "median_ns": figure.median_ns,
        "iqr_ns": figure.iqr_ns,
        "decided_by": best.decided_by,
    }


def generations(history: History, campaign_id: str) -> list[dict[str, Any]]:
    campaign = history.campaigns[campaign_id]
    rows: list[dict[str, Any]] = []
    board = RunningBoard()  # the leaderboard as of each generation
    for number in sorted(campaign.generations):
        state = campaign.generations[number]
        members = [history.candidates[cid] for cid in state.candidates]
        top = best_of(members)  # the generation's best, as its GenerationClosed names it
        board.add(members)
        chain = board.chain()  # the incumbent as the swarm promotes it (head to head)
        rows.append(
            {
                "generation": number,
                "planned": state.opened.planned,
                "proposed": len(members),
                "settled": sum(c.settled for c in members),
                "verified": sum(1 for c in members if c.verified),
                "rejected": sum(1 for c in members if c.rejected),
                "duplicates": sum(1 for c in members if c.duplicate),
                "best_in_generation": _brief(top, board),
                "best_so_far": _brief(chain[-1] if chain else None, board),
                "closed": state.closed is not None,
            }
        )
    return rows


def _brief(candidate: Candidate | None, board: RunningBoard) -> dict[str, Any] | None:
    """A kernel in a generation's row: its figure (`leaderboard.figure_of`), and the pooled
    time the ranking goes by."""
    if candidate is None or candidate.benchmark is None:
        return None
    own = board.own_time(candidate)
    figure = figure_of(candidate.benchmark)
    return {
        "candidate_id": candidate.candidate_id,
        "speedup": figure.speedup,
        "median_ns": figure.median_ns,
        "iqr_ns": figure.iqr_ns,
        "pooled_median_ns": own.median_ns if own else figure.median_ns,
        "timing_runs": own.runs if own else 1,
        "template": candidate.proposal.template,
        "params": candidate.proposal.params,
    }


def lessons(history: History, campaign_id: str) -> list[dict[str, Any]]:
    """Each lesson, and what the proposals made after it did with what it said."""
    campaign = history.campaigns[campaign_id]
    uses = _Uses([c.proposal for c in history.campaign_candidates(campaign_id)])
    return [
        {
            "generation": lesson.generation,
            "kind": lesson.kind,
            "statement": lesson.statement,
            "event_id": lesson.event_id,
            "evidence_ids": lesson.evidence_ids,
            "changed": uses.changed(lesson),
        }
        for lesson in campaign.lessons
    ]


class _Uses:
    """The generations of the proposals per template and per parameter value, in order,
    so "how many before and after generation g" is a bisection."""

    def __init__(self, proposals: list[CandidateProposed]) -> None:
        self.template: dict[str, list[int]] = defaultdict(list)
        self.value: dict[tuple[str, str, str], list[int]] = defaultdict(list)
        for p in sorted(proposals, key=lambda p: p.generation):
            self.template[p.template].append(p.generation)
            for name, value in p.params.items():
                self.value[(p.template, name, repr(value))].append(p.generation)

    def changed(self, lesson: LessonLearned) -> str:
        data = lesson.data
        if lesson.kind == "lineage":
            return f"best so far: {data.get('best')}"
        if "param" not in data or "template" not in data:
            return "no parameter to follow"
        template, name, value = str(data["template"]), str(data["param"]), data.get("value")
        total = self.template.get(template, [])
        hits = self.value.get((template, name, repr(value)), [])
        g = lesson.generation
        before_total, before_hits = bisect_right(total, g), bisect_right(hits, g)
        after_total, after_hits = len(total) - before_total, len(hits) - before_hits
        if not after_total:
            return f"no later proposal of {template} yet"
        said = "avoid" if data.get("avoid") else "not avoided" if "avoid" in data else "effect"
        return (
            f"{said}: later proposals of {template} with {name}={value!r}: "
            f"{after_hits} of {after_total} (up to then: {before_hits} of {before_total})"
        )


def rejections(candidates: list[Candidate]) -> list[dict[str, Any]]:
    counts: Counter[tuple[str, str]] = Counter()
    per_generation: dict[tuple[str, str], Counter[int]] = defaultdict(Counter)
    for c in candidates:
        if c.rejected is not None:
            key = (c.rejected.stage, c.rejected.reason)
            counts[key] += 1
            per_generation[key][c.proposal.generation] += 1
    return [
        {
            "stage": stage,
            "reason": reason,
            "count": count,
            "by_generation": dict(sorted(per_generation[(stage, reason)].items())),
        }
        for (stage, reason), count in counts.most_common()
    ]


def time_per_actor(events: list[tuple[int, Event]]) -> list[dict[str, Any]]:
    """Seconds from each event's cause to the event, summed per role that emitted it
    (waiting in the queue included)."""
    when = {event.event_id: event.ts for _, event in events}
    seconds: dict[str, float] = defaultdict(float)
    counts: Counter[str] = Counter()
    for _, event in events:
        cause = when.get(event.causation_id or "")
        if cause is None:
            continue
        seconds[event.actor.role] += max(0.0, (event.ts - cause).total_seconds())
        counts[event.actor.role] += 1
    return [
        {"role": role, "seconds": seconds[role], "events": counts[role]}
        for role in sorted(seconds, key=lambda r: -seconds[r])
    ]
