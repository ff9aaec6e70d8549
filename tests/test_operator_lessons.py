"""Operator lessons: what each variation operator paid over its parents on a problem
family, with its interval and its rejection share, drawn from evolve campaigns written
through the real strategy's and kernel writer's decisions (`tests.evolve_recording`); and
the audit of a store recorded under lesson rule 2 (before operator lessons:
`tests/recorded/evolve-rule-two.jsonl`) and of one recorded under rule 3."""

from __future__ import annotations

import html
import json
import math
import random
import statistics
from pathlib import Path

import msgspec
import pytest

from actors.campaign.history import Candidate, History
from actors.records.audit import audit_projections
from actors.search.lesson_stats import Moments, mean_interval, t_quantile, wilson_interval
from actors.search.lessons import MAX_EVIDENCE, RULE, draw_lessons, lesson_rule
from eventstore.codec import decode, encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.events import Event, GenerationClosed, LessonLearned
from eventstore.store import Recorded
from tests.evolve_history import HOST, ROWFLIP, VECSCALE, Log
from tests.evolve_recording import BREAKS, NAME, record_campaign
from tests.recorded_campaign import LOGS, kfactory

RULE_TWO_LOG = LOGS / "evolve-rule-two.jsonl"


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Log:
    return record_campaign(tmp_path_factory.mktemp("evolve"))


def operator_lessons(history: History, campaign_id: str = NAME) -> list[LessonLearned]:
    return [x for x in history.campaigns[campaign_id].lessons if x.kind == "operator"]


def children(history: History, operator: str) -> list[Candidate]:
    return [
        c
        for c in history.candidates.values()
        if c.proposal.template == "evolve" and c.proposal.operator == operator
    ]


def refused(child: Candidate) -> bool | None:
    """Whether a rejected child was refused (the write stage: no kernel to judge)."""
    return None if child.rejected is None else child.rejected.stage == "write"


def gains(history: History, operator: str) -> list[float]:
    """log(parent median / child median) of the operator's timed children."""
    out = []
    for child in children(history, operator):
        parent = history.candidates[child.proposal.parents[0]]
        if child.benchmark and parent.benchmark:
            out.append(math.log(parent.benchmark.median_ns / child.benchmark.median_ns))
    return out


def test_each_operator_says_what_it_paid_over_its_parents_with_its_interval(
    campaign: Log,
) -> None:
    history = campaign.history
    latest = max(x.generation for x in operator_lessons(history))
    told = [x for x in operator_lessons(history) if x.generation == latest]
    whole = {
        x.data["operator"]: x for x in told if x.data["param"] is None and x.data["device"] == HOST
    }
    assert whole, [x.statement for x in told]
    for operator, lesson in whole.items():
        xs = gains(history, operator)
        assert lesson.data["n"] == len(xs) >= 2
        mean, sd = statistics.fmean(xs), statistics.stdev(xs)
        half = t_quantile(0.975, len(xs) - 1) * sd / math.sqrt(len(xs))
        assert lesson.data["speedup"] == pytest.approx(math.exp(mean))
        assert lesson.data["ci"] == pytest.approx([math.exp(mean - half), math.exp(mean + half)])
        judged = [c for c in children(history, operator) if c.verified or refused(c) is False]
        assert lesson.data["judged"] == len(judged)
        assert lesson.statement.startswith(f"{operator} paid {math.exp(mean):.2f}x over its parent")
        assert f"on cols x rows fp32 cpu ({HOST}, 1 shape(s))" in lesson.statement
        assert len(lesson.evidence_ids) <= MAX_EVIDENCE
        cited = [history.candidate_of(i) for i in lesson.evidence_ids]
        assert {c.proposal.operator if c else None for c in cited} == {operator}
        assert lesson_rule(lesson.data) == RULE == 3


def test_an_operator_whose_children_fail_says_how_often_and_why(campaign: Log) -> None:
    history = campaign.history
    for operator in BREAKS:
        judged = [c for c in children(history, operator) if refused(c) is False]
        assert len(judged) >= 2 and not gains(history, operator)
        (lesson,) = [
            x
            for x in operator_lessons(history)
            if x.data["operator"] == operator
            and x.data["param"] is None
            and x.data["judged"] == len(judged)
        ]
        low, high = wilson_interval(len(judged), len(judged))
        assert lesson.data["rejected"] == len(judged) and lesson.data["device"] is None
        assert lesson.data["rejected_ci"] == pytest.approx([low, high])
        assert lesson.data["reason"] == {
            "stage": "compare",
            "reason": "wrong_value",
            "count": len(judged),
        }
        assert f"{len(judged)} of {len(judged)} judged rejected" in lesson.statement
        assert "commonest at compare (wrong_value)" in lesson.statement


def test_a_parameter_value_gets_its_own_lesson_only_where_not_all_children_had_it(
    campaign: Log,
) -> None:
    told = operator_lessons(campaign.history)
    by_value = [x for x in told if x.data["param"] is not None]
    assert by_value
    for lesson in by_value:
        whole = [
            x
            for x in told
            if x.generation == lesson.generation
            and x.data["operator"] == lesson.data["operator"]
            and x.data["param"] is None
        ]
        assert whole and all(lesson.data["judged"] < x.data["judged"] for x in whole)
        value = f"{lesson.data['param']}={lesson.data['value']!r}"
        assert lesson.statement.startswith(f"{lesson.data['operator']} with {value} ")


def test_a_problem_of_the_family_shares_the_lessons_one_of_another_family_does_not(
    tmp_path: Path,
) -> None:
    log = record_campaign(tmp_path, generations=2)
    log.then("flip", (64, 512), ROWFLIP).timed_seed()  # rows x cols: the same family
    log.then("vec", (4096,), VECSCALE).timed_seed()  # n: another

    def said(campaign_id: str) -> set[str]:
        drawn = draw_lessons(log.history, campaign_id)
        return {x.statement for x in drawn if x.kind == "operator"}

    assert said(NAME) and said("flip") == said(NAME)
    assert said("vec") == set()


def test_tallies_kept_as_the_history_grows_draw_what_a_fresh_replay_draws(campaign: Log) -> None:
    grown = History()
    for position, event in enumerate(campaign.events, 1):
        grown.apply(position, event)
        if isinstance(event, GenerationClosed):
            fresh = History()
            for p, e in enumerate(campaign.events[:position], 1):
                fresh.apply(p, e)
            assert draw_lessons(fresh, NAME) == draw_lessons(grown, NAME)


def test_merged_moments_are_those_of_the_union_and_the_mean_interval_is_students() -> None:
    rng = random.Random(4)
    parts = [[rng.gauss(0.3, 0.5) for _ in range(rng.randint(0, 9))] for _ in range(5)]
    tallied = []
    for values in parts:
        moments = Moments()
        for x in values:
            moments.add(x)
        tallied.append(moments)
    union = [x for values in parts for x in values]
    merged = Moments.merged(tallied)
    assert merged.n == len(union)
    assert merged.mean == pytest.approx(statistics.fmean(union))
    assert merged.variance == pytest.approx(statistics.variance(union))
    interval = mean_interval(merged)
    half = t_quantile(0.975, len(union) - 1) * statistics.stdev(union) / math.sqrt(len(union))
    assert (interval.low, interval.high) == pytest.approx((merged.mean - half, merged.mean + half))


# --- the audit: rule 2 stores re-derived as rule 2 drew them, rule 3 with operators ------


def rule_two_events() -> list[Event]:
    return [decode(line) for line in RULE_TWO_LOG.read_bytes().splitlines() if line.strip()]


def lesson_claims(events: list[Event], campaign_id: str = NAME) -> list[tuple[str, str]]:
    claims = audit_projections(list(enumerate(events, 1)), campaign_id)
    return [(c.status, c.evidence) for c in claims if c.name == "lessons"]


def test_a_store_recorded_under_rule_two_is_rederived_as_rule_two_drew_it(
    tmp_path: Path,
) -> None:
    events = rule_two_events()
    told = [e for e in events if isinstance(e, LessonLearned)]
    assert told and {lesson_rule(x.data) for x in told} == {2}
    assert not [x for x in told if x.kind == "operator"]
    history = History()
    for position, event in enumerate(events, 1):
        history.apply(position, event)
    # Today's rule would have drawn operator lessons on this history: only drawing under
    # the rule it was recorded with gives what was recorded.
    assert [x for x in draw_lessons(history, NAME) if x.kind == "operator"]
    generations = len({x.generation for x in told})
    assert lesson_claims(events) == [
        ("agrees", f"{generations} generations' lessons re-derived, all equal")
    ]
    store = DuckDBEventStore(tmp_path / "events.duckdb")
    store.append([Recorded(e, encode(e)) for e in events])
    store.close()
    done = kfactory("audit", NAME, "--home", str(tmp_path), "--json")
    report = json.loads(done.stdout)
    claims = [c for c in report["claims"] if c["name"] == "lessons"]
    assert [c["status"] for c in claims] == ["agrees"], claims


def test_a_store_recorded_under_rule_three_is_rederived_with_its_operator_lessons(
    campaign: Log,
) -> None:
    events = list(campaign.events)
    told = [e for e in events if isinstance(e, LessonLearned)]
    assert {lesson_rule(x.data) for x in told} == {3}
    generations = len({e.generation for e in events if isinstance(e, GenerationClosed)})
    assert lesson_claims(events) == [
        ("agrees", f"{generations} generations' lessons re-derived, all equal")
    ]
    dropped = next(e for e in reversed(told) if e.kind == "operator")
    claims = lesson_claims([e for e in events if e is not dropped])
    assert [s for s, _ in claims] == ["differs"]
    assert "re-derived but not recorded" in claims[0][1] and dropped.statement in claims[0][1]


def test_lessons_under_rule_two_after_rule_three_ones_differ(campaign: Log) -> None:
    events = list(campaign.events)
    latest = max(e.generation for e in events if isinstance(e, LessonLearned))
    stamped: list[Event] = []
    for e in events:
        if isinstance(e, LessonLearned) and e.generation == latest:
            if e.kind == "operator":
                continue  # as a rule-2 librarian would have drawn them
            e = msgspec.structs.replace(e, data={**e.data, "rule": 2})
        stamped.append(e)
    claims = lesson_claims(stamped)
    assert any(
        s == "differs" and f"generation {latest}: lessons under rule v2 after generation" in ev
        for s, ev in claims
    ), claims


# --- where users see lessons ---------------------------------------------------------------


def test_users_see_the_operator_lessons_in_the_report_the_replay_sql_and_lessons(
    campaign: Log, tmp_path: Path
) -> None:
    store = DuckDBEventStore(tmp_path / "events.duckdb")
    store.append([Recorded(e, encode(e)) for e in campaign.events])
    store.close()
    home = ("--home", str(tmp_path))
    latest = operator_lessons(campaign.history)[-1]
    page = tmp_path / "report.html"
    done = kfactory("report", NAME, *home, "-o", str(page))
    assert done.returncode == 0, done.stderr
    assert html.escape(latest.statement) in page.read_text()
    done = kfactory("replay", NAME, *home, "--json", "--lessons", "1000")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)["lessons"]
    assert {"operator", latest.statement} <= {x["kind"] for x in shown} | {
        x["statement"] for x in shown
    }
    query = "SELECT statement, data->>'operator' AS operator FROM lessons WHERE kind = 'operator'"
    done = kfactory("sql", query, "-f", "json", *home)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert {"statement": latest.statement, "operator": latest.data["operator"]} in rows
    assert len(rows) == len(operator_lessons(campaign.history))
    done = kfactory("lessons", NAME, *home, "--kind", "operator", "--latest", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert {x["kind"] for x in listed} == {"operator"} and latest.statement in {
        x["statement"] for x in listed
    }
    # --latest: one lesson per operator, parameter value and host, each its last word.
    subjects = {
        (x.data["operator"], x.data["param"], repr(x.data["value"]), x.data["device"]): x.statement
        for x in operator_lessons(campaign.history)
    }
    assert sorted(x["statement"] for x in listed) == sorted(subjects.values())
    done = kfactory("lessons", NAME, *home, "--kind", "operator")
    assert done.returncode == 0 and latest.statement in done.stdout.replace("\n", " ")
    missing = kfactory("lessons", "no-such-campaign", *home)
    assert missing.returncode != 0 and "no campaign 'no-such-campaign'" in missing.stderr
