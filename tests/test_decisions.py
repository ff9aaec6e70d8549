"""The planner's and the librarian's decisions, driven from a recorded campaign's events:
no NATS, no compiler, no device. Each decision is replayed at the event that caused it
in the recording and must give what the swarm gave; variations of the log (a dead
letter, a resume after a gap, a problem with no design space) check the rest."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypeVar

import msgspec
import pytest

from actors.campaign.history import History
from actors.campaign.leaderboard import campaign_leaderboard
from actors.roles.librarian import decide_librarian
from actors.roles.planner import WALL_TIME_REASON, decide_deadline, decide_planner
from actors.runtime import Reactions
from actors.search.lessons import (
    MAX_EVIDENCE,
    RULE,
    draw_lessons,
    lesson_rule,
    parameter_effects,
    regions_to_avoid,
)
from actors.search.spaces import design_spaces
from eventstore.events import (
    ActorRef,
    BenchmarkCompleted,
    CampaignFinished,
    CampaignResumed,
    CampaignStalled,
    CampaignStarted,
    CandidateProposed,
    DeadLettered,
    Event,
    GenerationClosed,
    GenerationOpened,
    KernelVerified,
    LessonLearned,
    new_event,
)
from kernels import host_isa
from ops.run_cmd import _generations
from tests.decision_log import as_recorded, read_log, replay

E = TypeVar("E", bound=Event)
LOG = "softmax-two-generations.jsonl"
PLANNER = ActorRef("planner", "planner-0", "test")
LIBRARIAN = ActorRef("librarian", "librarian-0", "test")
LIBRARIAN_REACTS_TO = (GenerationOpened, BenchmarkCompleted, DeadLettered)


@pytest.fixture(scope="module")
def log() -> list[Event]:
    return read_log(LOG)


@pytest.fixture(autouse=True)
def the_recording_hosts_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU spaces the planner searches depend on the host's ISA (explicit AVX-512
    points only where the CPU has it), and the log was recorded on a host without
    AVX-512: each decision is replayed as on that host."""
    monkeypatch.setattr(host_isa, "host_cpu_flags", lambda: frozenset({"avx2", "fma"}))


def history_of(events: list[Event]) -> History:
    history = History()
    for position, event in enumerate(events, 1):
        history.apply(position, event)
    return history


def shape_of(event: Event) -> dict[str, Any]:
    """What a decision chose, without the envelope (ids, times, who)."""
    data: dict[str, Any] = msgspec.to_builtins(event)
    for envelope in ("event_id", "ts", "actor", "causation_id", "correlation_id", "summary"):
        data.pop(envelope, None)
    return data


def planner_decision(history: History, event: Event, now: datetime | None = None) -> list[Event]:
    campaign = history.campaigns[event.campaign_id]
    spec = campaign.spec
    scope = history.scope_candidates(spec.problem, spec.target, spec.dtype)
    out = Reactions(event, PLANNER)
    decide_planner(
        history,
        event,
        out,
        now=now or event.ts,
        spaces=[as_recorded(s) for s in design_spaces(spec.problem, spec.target, spec.dtype)],
        known={c.proposal.param_key for c in scope},
        # as the planner asks the librarian: the regions its recorded lessons avoid
        avoid=regions_to_avoid(x.data for x in campaign.lessons),
    )
    return out.events


def test_the_librarian_replayed_closes_each_generation_with_the_recorded_lessons(
    log: list[Event],
) -> None:
    recorded = [e for e in log if isinstance(e, LessonLearned | GenerationClosed)]
    decided: list[Event] = []
    for history, event in replay(
        [e for e in log if not isinstance(e, LessonLearned | GenerationClosed)]
    ):
        if isinstance(event, LIBRARIAN_REACTS_TO):
            out = Reactions(event, LIBRARIAN)
            decide_librarian(history, event, out)
            for reaction in out.events:  # what the swarm stored, the next decision sees
                history.apply(history.position + 1, reaction)
            decided += out.events
    closes = [shape_of(e) for e in decided if isinstance(e, GenerationClosed)]
    assert closes == [shape_of(e) for e in recorded if isinstance(e, GenerationClosed)]
    assert [c["generation"] for c in closes] == [0, 1]
    assert all(c["settled"] == c["evaluated"] == 4 for c in closes)
    # The log's lessons were drawn under the first rule (no interval, every timed kernel
    # cited): today's rule states each with its interval, so their words differ, but it
    # draws every effect the swarm drew, with the same sizes and ratios, and the same
    # lineage, in each generation.
    for generation in (0, 1):
        told = [e for e in recorded if isinstance(e, LessonLearned) and e.generation == generation]
        drawn = {
            (x.kind, x.data.get("param"), repr(x.data.get("value"))): x
            for x in decided
            if isinstance(x, LessonLearned) and x.generation == generation
        }
        assert told and all(lesson_rule(x.data) == 1 for x in told)
        for old in told:
            new = drawn[(old.kind, old.data.get("param"), repr(old.data.get("value")))]
            assert lesson_rule(new.data) == RULE
            for key in ("effect_size", "speedup_ratio", "n", "chain", "best"):
                if key in old.data:
                    assert new.data[key] == pytest.approx(old.data[key]), (key, old.statement)


def test_the_planner_replayed_proposes_what_the_swarm_proposed_and_finishes_on_budget(
    log: list[Event],
) -> None:
    decided: list[dict[str, Any]] = []
    for history, event in replay(log):
        if isinstance(event, CampaignStarted | GenerationClosed):
            decided += [shape_of(e) for e in planner_decision(history, event)]
    recorded = [
        shape_of(e)
        for e in log
        if isinstance(e, GenerationOpened | CandidateProposed | CampaignFinished)
    ]
    # the log was recorded before final runs: where it finished, the search ends now by
    # asking for the final run of its top 4, with the reason it finished for
    assert decided[:-1] == recorded[:-1]
    assert recorded[-1] == {
        "type": "CampaignFinished",
        "campaign_id": "recorded",
        "schema": 1,
        "reason": "budget reached: 8 candidates",
    }
    final = decided[-1]
    assert (final["type"], final["reason"]) == ("FinalRunRequested", recorded[-1]["reason"])
    assert len(final["contenders"]) == 4


def test_generation_one_used_what_generation_zero_taught(log: list[Event]) -> None:
    closed = next(e for e in log if isinstance(e, GenerationClosed) and e.generation == 0)
    history = history_of(log[: log.index(closed) + 1])
    lessons = {x.statement for x in draw_lessons(history, "recorded")}
    assert any(s.startswith("best-so-far lineage: recorded:g0:") for s in lessons), lessons
    proposed = [e for e in planner_decision(history, closed) if isinstance(e, CandidateProposed)]
    earlier = {c.proposal.param_key for c in history.campaign_candidates("recorded")}
    assert len(proposed) == 4 and not {p.param_key for p in proposed} & earlier


def test_lesson_content_names_the_parameter_its_effect_and_its_evidence(
    log: list[Event],
) -> None:
    history = history_of(log)
    timed = [c for c in history.campaign_candidates("recorded") if c.benchmark]
    assert len(timed) >= 4
    # A parameter value with two or more samples and two or more others in its template.
    template, name, value = next(
        (c.proposal.template, k, v)
        for c in timed
        for k, v in sorted(c.proposal.params.items())
        if 2
        <= sum(
            x.proposal.params.get(k) == v
            for x in timed
            if x.proposal.template == c.proposal.template
        )
        <= sum(x.proposal.template == c.proposal.template for x in timed) - 2
    )
    # Make that value clearly better: twice the speedup of the others.
    for c in timed:
        assert c.benchmark is not None
        speedup = 4.0 if c.proposal.params.get(name) == value else 2.0
        c.benchmark = msgspec.structs.replace(c.benchmark, speedup=speedup)
    same = [c for c in timed if c.proposal.template == template]
    with_value = [c for c in same if c.proposal.params[name] == value]
    others = [c for c in same if c.proposal.params[name] != value]
    effects = [
        x
        for x in parameter_effects(timed)
        if x.data["param"] == name and x.data["value"] == value and x.data["template"] == template
    ]
    (lesson,) = effects
    assert lesson.statement.startswith(f"{template}: {name}={value!r} gives 2.00x the speedup")
    assert f"n={len(with_value)} vs {len(others)})" in lesson.statement  # no noise: certain
    assert lesson.data["speedup_ratio"] == pytest.approx(2.0)
    assert lesson.data["ci"] == pytest.approx([2.0, 2.0])
    assert (lesson.data["n"], lesson.data["n_other"]) == (len(with_value), len(others))
    cited = set(lesson.evidence_ids)  # a sample of both sides: extremes, the first ones
    assert cited <= {c.benchmark.event_id for c in same if c.benchmark}
    assert len(cited) <= MAX_EVIDENCE
    for side in (with_value, others):
        first = next(c for c in side if c.benchmark)
        assert first.benchmark and first.benchmark.event_id in cited


def test_a_dead_letter_settles_its_candidate_as_failed_and_closes_the_generation(
    log: list[Event],
) -> None:
    last_benchmark = next(e for e in log if isinstance(e, BenchmarkCompleted) and e.generation == 0)
    verified = next(
        e
        for e in log
        if isinstance(e, KernelVerified) and e.candidate_id == last_benchmark.candidate_id
    )
    gen0 = [
        e
        for e in log
        if not isinstance(e, LessonLearned | GenerationClosed)
        and getattr(e, "generation", 0) == 0
        and e is not last_benchmark
    ]
    dead = dead_letter(verified, "kf-benchmarker-cpu", "RuntimeError: the harness broke")
    history = history_of([*gen0, dead])
    candidate = history.candidates[last_benchmark.candidate_id]
    assert candidate.settled and candidate.failed_undelivered
    assert history.rejections_by_stage("recorded") == {"dead_letter": 1}
    out = Reactions(dead, LIBRARIAN)
    decide_librarian(history, dead, out)
    (closed,) = [e for e in out.events if isinstance(e, GenerationClosed)]
    assert closed.generation == 0 and closed.settled == 4 and closed.evaluated == 4
    assert not any(isinstance(e, CampaignStalled) for e in out.events)


def test_a_generation_whose_every_candidate_was_dead_lettered_stalls_until_resumed(
    log: list[Event],
) -> None:
    proposals = [e for e in log if isinstance(e, CandidateProposed) and e.generation == 0]
    start = log[: log.index(proposals[-1]) + 1]
    then = proposals[-1].ts + timedelta(seconds=10)  # the recording's clock, not today's
    dead = [
        at(dead_letter(p, "kf-kernel-writer", "ValueError: template broke"), then)
        for p in proposals
    ]
    history = history_of([*start, *dead])
    out = Reactions(dead[-1], LIBRARIAN)
    decide_librarian(history, dead[-1], out)
    stalled, closed = out.events[-2:]
    assert isinstance(stalled, CampaignStalled) and isinstance(closed, GenerationClosed)
    assert stalled.kind == "dead_lettered" and stalled.role == "kernel-writer"
    assert "all 4 candidate(s)" in stalled.detail and "template broke" in stalled.detail
    for reaction in out.events:
        history.apply(history.position + 1, at(reaction, then))
    assert history.campaigns["recorded"].stalled is not None
    assert planner_decision(history, closed, then) == []  # not into the same wall again
    resumed = at(
        new_event(CampaignResumed, campaign_id="recorded", actor=PLANNER, cause=closed), then
    )
    history.apply(history.position + 1, resumed)
    assert history.campaigns["recorded"].stalled is None
    reopened = planner_decision(history, resumed, then)
    assert isinstance(reopened[0], GenerationOpened) and reopened[0].generation == 1


def test_no_design_space_stalls_the_campaign_with_its_reason(log: list[Event]) -> None:
    started = log[0]
    assert isinstance(started, CampaignStarted)
    history = history_of([started])
    out = Reactions(started, PLANNER)
    decide_planner(history, started, out, now=started.ts, spaces=[])
    (stalled,) = out.events
    assert isinstance(stalled, CampaignStalled) and stalled.kind == "no_design_space"
    assert "no design space to search for softmax on cpu" in stalled.detail


def test_the_wall_time_is_active_time_and_finishes_the_campaign(log: list[Event]) -> None:
    started = log[0]
    assert isinstance(started, CampaignStarted)
    opened = next(e for e in log if isinstance(e, GenerationOpened))
    history = history_of(log[: log.index(opened) + 1])
    campaign = history.campaigns["recorded"]
    wall = campaign.spec.budget.wall_seconds()
    before, after = started.ts + timedelta(seconds=wall - 1), started.ts + timedelta(seconds=wall)
    out = Reactions(started, PLANNER)
    decide_deadline(history, "recorded", out, now=before)
    assert out.events == []
    decide_deadline(history, "recorded", out, now=after)
    (finished,) = out.events
    assert isinstance(finished, CampaignFinished) and finished.reason == WALL_TIME_REASON
    # A resume a day later: the gap is not counted, only the time the campaign ran.
    ran = (opened.ts - started.ts).total_seconds()
    resumed = msgspec.structs.replace(
        new_event(CampaignResumed, campaign_id="recorded", actor=PLANNER),
        ts=opened.ts + timedelta(days=1),
    )
    history.apply(history.position + 1, resumed)
    assert campaign.active_seconds(resumed.ts + timedelta(seconds=5)) == pytest.approx(ran + 5)
    out = Reactions(resumed, PLANNER)
    decide_deadline(history, "recorded", out, now=resumed.ts + timedelta(seconds=wall - ran - 1))
    assert out.events == []


def at(event: E, ts: datetime) -> E:
    return msgspec.structs.replace(event, ts=ts)


def dead_letter(original: Event, consumer: str, reason: str) -> DeadLettered:
    return new_event(
        DeadLettered,
        campaign_id=original.campaign_id,
        actor=ActorRef(consumer.removeprefix("kf-"), "x", "test"),
        consumer=consumer,
        subject=f"kf.ev.{original.campaign_id}.{original.type}",
        stream_seq=1,
        deliveries=5,
        reason=reason,
        original_event_id=original.event_id,
    )


def test_the_run_reports_each_generation_and_the_lessons_it_searched_with(
    log: list[Event],
) -> None:
    history = history_of(log)
    rows = _generations(history, "recorded", campaign_leaderboard(history, "recorded"))
    drawn = [e for e in log if isinstance(e, LessonLearned) and e.generation == 0]
    assert drawn, "the recorded campaign drew lessons in generation 0"
    assert [(r["generation"], r["proposed"], r["settled"], r["closed"]) for r in rows] == [
        (0, 4, 4, True),
        (1, 4, 4, True),
    ]
    assert rows[0]["lessons_used"] == 0 and rows[0]["new_lessons"] == []
    assert rows[1]["lessons_used"] == len(drawn)
    assert rows[1]["new_lessons"] == [x.statement for x in drawn]
