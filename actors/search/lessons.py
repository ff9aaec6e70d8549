"""Lessons drawn from the history of one problem and target, each saying how sure it is
and citing a bounded sample of its evidence.

- parameter effects: how a template parameter's value moves the speedup: the ratio of
  the geometric mean speedups with and without it, its 95% Welch interval (on the
  difference of mean log speedups) and both sample sizes. A value needs `MIN_SAMPLES`
  timed kernels on each side and an effect size (in the template's standard deviations)
  of at least `MIN_EFFECT` to be stated; it is `significant` when its interval excludes
  no effect;
- failure signatures: rejections grouped by stage, reason and first message line, with
  their share of the evaluated kernels and its Wilson interval;
- regions: a parameter value whose kernels fail as wrong kernels (compile, static, run,
  compare) more often than the template's others, significantly: at least
  `MIN_FAILURES` failures and a one-sided Fisher exact p below `ALPHA` after Holm's
  correction over the values the template tried (a template of 20 values would otherwise
  show one "significant" value by chance in every draw). The lesson names
  the recorded reason most of them failed for and its first message line. The planner
  avoids the value (`prunes`) only when nothing else carries those failures better: of
  the features every such failure shared (other parameter values, compiler flags), the
  one whose own rate of failures for that reason is the most significant; when that is
  another (`-ffast-math` for lost NaNs), the lesson names it and avoids nothing;
- operators: what each variation operator (and each value of its parameters that not all
  its children shared) paid over the problem's family (`actors.search.problem_family`),
  per host that timed its children: the geometric mean of its children's speedups over
  their first parents, the 95% t interval of the mean log ratio and the sample size, the
  shapes timed, and its rejection share among the children judged, with its Wilson
  interval and the commonest reason. An arm is stated per host where it has
  `MIN_SAMPLES` children timed there, and once without a host where it has that many
  judged but timed on no host that often (`actors.search.operator_tally`);
- lineage: the candidates that became the campaign's best (own time, head to head), in
  order.

Effects, failures and regions are drawn over every candidate of the problem, target and
dtype (all campaigns); operators over the family's; the lineage over this campaign's.
Each lesson's `data` is a fixed-size summary and its `evidence_ids` at most
`MAX_EVIDENCE` events (the extremes and the first and latest), whatever the history's
size; the tallies they come from are kept as the history grows
(`actors.search.lesson_tally`, `actors.search.operator_tally`). The librarian emits them
when it closes a generation; the audit re-derives them with this same `draw_lessons`.

`data["rule"]` is `RULE`, the version of these rules. Lessons recorded before it
(rule 1: every timed kernel cited, every value whose few kernels all failed avoided)
have no such key: the audit does not re-derive them, and the planner prunes nothing by
them. Rule 2 is rule 3 without the operator lessons: `draw_lessons(..., rule=2)` draws
them as a rule-2 librarian did, and its regions prune as rule 3's do
(`SIGNIFICANCE_RULE`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from actors.campaign.history import Candidate, History
from actors.campaign.leaderboard import figure_of
from actors.search.lesson_stats import (
    CONFIDENCE,
    fisher_greater,
    mean_interval,
    welch_interval,
    wilson_interval,
)
from actors.search.lesson_tally import Feature, LessonBook, ScopeTally, Spread, feature_words
from actors.search.operator_tally import OperatorArm, OperatorBook, Outcomes, Timed
from actors.search.problem_family import Family

RULE = 3
RULES = (2, 3)
"""The rules `draw_lessons` draws under (the audit re-derives lessons of these)."""
SIGNIFICANCE_RULE = 2
"""The first rule whose regions were avoided only on a significant test."""
OPERATOR_KINDS = ("operator",)
"""The kinds of lesson rule 3 added to rule 2."""
MIN_SAMPLES = 2
MIN_EFFECT = 0.5
MIN_FAILURES = 3
ALPHA = 0.05
MAX_EVIDENCE = 8


@dataclass(frozen=True)
class Lesson:
    kind: str
    statement: str
    evidence_ids: list[str]
    data: dict[str, Any] = field(default_factory=dict)


def lesson_rule(data: dict[str, Any]) -> int:
    """The rule a recorded lesson was drawn under (1 before rules had a version)."""
    rule = data.get("rule")
    return rule if isinstance(rule, int) and not isinstance(rule, bool) else 1


def prunes(data: dict[str, Any]) -> bool:
    """Whether a recorded lesson marks a region the search must avoid: only lessons drawn
    under the significance rule (`SIGNIFICANCE_RULE` and later) do."""
    return bool(data.get("avoid")) and lesson_rule(data) >= SIGNIFICANCE_RULE


def regions_to_avoid(lessons: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The regions to avoid, from recorded lessons' `data` in the order they were
    recorded: those whose latest lesson under the significance rule says so (a value
    avoided once, whose failures another feature was later found to carry, is not)."""
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for data in lessons:
        if lesson_rule(data) >= SIGNIFICANCE_RULE and "avoid" in data:
            region = (str(data.get("template")), str(data.get("param")), repr(data.get("value")))
            latest[region] = data
    return [data for data in latest.values() if prunes(data)]


def draw_lessons(history: History, campaign_id: str, rule: int = RULE) -> list[Lesson]:
    """The lessons the history shows the campaign now, as a librarian of `rule` (one of
    `RULES`) drew them."""
    return under_rule(_draw(history, campaign_id), rule)


def under_rule(drawn: list[Lesson], rule: int) -> list[Lesson]:
    """Lessons drawn under `RULE` as a librarian of `rule` drew them: rule 2 had no
    operator lessons, and stamped its own number."""
    if rule not in RULES:
        raise ValueError(f"lessons are drawn under rules {RULES}, not {rule}")
    if rule == RULE:
        return drawn
    return [
        Lesson(x.kind, x.statement, x.evidence_ids, {**x.data, "rule": rule})
        for x in drawn
        if x.kind not in OPERATOR_KINDS
    ]


def _draw(history: History, campaign_id: str) -> list[Lesson]:
    campaign = history.campaigns[campaign_id]
    spec = campaign.spec
    book = LessonBook.of(history)
    tally = book.scope(spec.problem, spec.target, spec.dtype)
    operators = OperatorBook.of(history)
    family = operators.family((spec.problem, spec.target, spec.dtype))
    return [
        *_effects(tally),
        *_signatures(tally),
        *_regions(tally),
        *(operator_lessons(family, operators.arms(family)) if family else []),
        *lineage(book.lineage(campaign_id).chain(lambda: history.campaign_candidates(campaign_id))),
    ]


def parameter_effects(scope: list[Candidate]) -> list[Lesson]:
    return _effects(ScopeTally.of(scope))


def failure_signatures(scope: list[Candidate]) -> list[Lesson]:
    return _signatures(ScopeTally.of(scope))


def avoided_regions(scope: list[Candidate]) -> list[Lesson]:
    return _regions(ScopeTally.of(scope))


def _bounded(ids: list[str]) -> list[str]:
    return list(dict.fromkeys(ids))[:MAX_EVIDENCE]


def _effects(tally: ScopeTally) -> list[Lesson]:
    lessons = []
    for key in sorted(tally.values, key=str):  # the order of the keys' text
        template, name, value = key
        group = tally.values[key].moments
        everything = tally.timed[template]
        others = everything.without(group)
        if group.n < MIN_SAMPLES or others.n < MIN_SAMPLES:
            continue
        spread = everything.pstdev or 1e-9
        effect = (group.mean - others.mean) / spread
        if abs(effect) < MIN_EFFECT:
            continue
        interval = welch_interval(group, others)
        ratio, low, high = (math.exp(x) for x in (interval.difference, interval.low, interval.high))
        significant = interval.excludes_zero
        siblings = Spread.merged(
            tally.values[(template, name, v)].spread
            for v in tally.values_of[(template, name)]
            if v != value
        )
        lessons.append(
            Lesson(
                kind="parameter_effect",
                statement=(
                    f"{template}: {name}={value!r} gives {ratio:.2f}x the speedup of other "
                    f"values ({CONFIDENCE:.0%} CI {low:.2f}x-{high:.2f}x, n={group.n} vs "
                    f"{others.n}{'' if significant else ', not significant'})"
                ),
                evidence_ids=_bounded(tally.values[key].spread.ids() + siblings.ids()),
                data={
                    "rule": RULE,
                    "template": template,
                    "param": name,
                    "value": value,
                    "n": group.n,
                    "n_other": others.n,
                    "mean_log_speedup": group.mean,
                    "mean_log_speedup_other": others.mean,
                    "effect_size": effect,
                    "speedup_ratio": ratio,
                    "ci": [low, high],
                    "confidence": CONFIDENCE,
                    "df": interval.df if math.isfinite(interval.df) else None,
                    "significant": significant,
                },
            )
        )
    return lessons


def _signatures(tally: ScopeTally) -> list[Lesson]:
    lessons = []
    for (stage, reason, signature), group in sorted(tally.signatures.items()):
        low, high = wilson_interval(group.count, tally.judged)
        lessons.append(
            Lesson(
                kind="failure_signature",
                statement=(
                    f"{group.count} of {tally.judged} evaluated candidate(s) rejected at "
                    f"{stage} ({reason}), {CONFIDENCE:.0%} CI {low:.0%}-{high:.0%} of them"
                    + (f": {signature}" if signature else "")
                ),
                evidence_ids=_bounded(group.rejections.ids()),
                data={
                    "rule": RULE,
                    "stage": stage,
                    "reason": reason,
                    "signature": signature,
                    "count": group.count,
                    "evaluated": tally.judged,
                    "rate_ci": [low, high],
                    "confidence": CONFIDENCE,
                },
            )
        )
    return lessons


@dataclass(frozen=True)
class _Carrier:
    """A feature and how its rate of failures for one reason stands against the rest."""

    feature: Feature
    failed: int
    evaluated: int
    p_value: float


def _carrier(tally: ScopeTally, template: str, value: Feature, reason: tuple[str, str]) -> _Carrier:
    """Of the features every failure of `value` for `reason` shared (itself included),
    the one whose rate of such failures is the most significant; ties go to the one
    with more of them, then to `value`, then to a parameter over a flag."""
    evaluated, failed = tally.evaluated[template], tally.failed_for[(template, reason)]
    found = []
    for feature in tally.features[(template, value)].shared[reason]:
        hits = tally.features[(template, feature)].reasons[reason]
        tried = tally.evaluated_with[(template, feature)]
        p = fisher_greater(hits, tried, failed - hits, evaluated - tried)
        rank = 0 if feature == value else 1 if feature[0] == "param" else 2
        found.append((p, -hits, rank, str(feature), _Carrier(feature, hits, tried, p)))
    return min(found, key=lambda f: f[:4])[4]


@dataclass(frozen=True)
class _Test:
    """A parameter value's failures against its template's others."""

    template: str
    value: Feature
    failed: int
    evaluated: int
    other_failed: int
    other_evaluated: int
    p_value: float


def _significant(tally: ScopeTally) -> list[tuple[_Test, float, int]]:
    """The parameter values that fail significantly more than their template's others:
    `MIN_FAILURES` or more, and a one-sided Fisher p under `ALPHA` after Holm's step-down
    over the values the template tried (each with its threshold and that count)."""
    tests: dict[str, list[_Test]] = {}
    tried: dict[str, int] = {}
    for template, feature in tally.evaluated_with:
        if feature[0] == "param":
            tried[template] = tried.get(template, 0) + 1
    for template, value in tally.features:
        counts = tally.features[(template, value)]
        failed, evaluated = counts.failed, tally.evaluated_with[(template, value)]
        other_failed = tally.failed[template] - failed
        other_evaluated = tally.evaluated[template] - evaluated
        if value[0] != "param" or failed < MIN_FAILURES:
            continue
        if failed * other_evaluated <= other_failed * evaluated:
            continue  # not a rate above the others'
        p = fisher_greater(failed, evaluated, other_failed, other_evaluated)
        test = _Test(template, value, failed, evaluated, other_failed, other_evaluated, p)
        tests.setdefault(template, []).append(test)
    found = []
    for template, among in tests.items():
        for rank, test in enumerate(sorted(among, key=lambda t: (t.p_value, str(t.value)))):
            threshold = ALPHA / (tried[template] - rank)
            if test.p_value >= threshold:
                break
            found.append((test, threshold, tried[template]))
    return sorted(found, key=lambda f: str((f[0].template, f[0].value)))


def _regions(tally: ScopeTally) -> list[Lesson]:
    lessons = []
    for test, threshold, family in _significant(tally):
        template, value = test.template, test.value
        counts = tally.features[(template, value)]
        reason, count = min(counts.reasons.items(), key=lambda r: (-r[1], r[0]))
        stage, why = reason
        signature = min(
            (s for s in counts.signatures.items() if s[0][:2] == reason),
            key=lambda s: (-s[1], s[0]),
        )[0][2]
        carrier = _carrier(tally, template, value, reason)
        avoid = carrier.feature == value
        said = (
            f"{template}: {feature_words(value)} fails more than other values: {test.failed} "
            f"of {test.evaluated} evaluated vs {test.other_failed} of {test.other_evaluated} "
            f"(one-sided Fisher p={test.p_value:.2g} < {threshold:.2g}, Holm over {family} "
            f"values); {count} of them at {stage} ({why})" + (f": {signature}" if signature else "")
        )
        if avoid:
            said += ": avoid it"
        else:
            said += (
                f"; carried by {feature_words(carrier.feature)} ({carrier.failed} of "
                f"{carrier.evaluated} with it failed so, p={carrier.p_value:.2g}): not avoided"
            )
        lessons.append(
            Lesson(
                kind="failure_signature",
                statement=said,
                evidence_ids=_bounded(counts.rejections.ids()),
                data={
                    "rule": RULE,
                    "template": template,
                    "param": value[1],
                    "value": value[2],
                    "avoid": avoid,
                    "failed": test.failed,
                    "evaluated": test.evaluated,
                    "failed_other": test.other_failed,
                    "evaluated_other": test.other_evaluated,
                    "p_value": test.p_value,
                    "threshold": threshold,
                    "values_tested": family,
                    "alpha": ALPHA,
                    "reason": {"stage": stage, "reason": why, "signature": signature},
                    "reason_count": count,
                    "carried_by": None
                    if avoid
                    else {
                        "kind": carrier.feature[0],
                        "name": carrier.feature[1],
                        "value": carrier.feature[2],
                        "failed": carrier.failed,
                        "evaluated": carrier.evaluated,
                        "p_value": carrier.p_value,
                    },
                },
            )
        )
    return lessons


def operator_lessons(family: Family, arms: dict[OperatorArm, Outcomes]) -> list[Lesson]:
    """What each operator, and each parameter value of it that not all its children
    shared, paid on the family (see the module's docstring)."""
    lessons = []
    for arm, outcomes in arms.items():
        operator, name, _ = arm
        if name and outcomes.judged >= arms[(operator, "", None)].judged:
            continue  # every child of the operator had this value: the operator's lesson
        hosts = [d for d, t in outcomes.timed.items() if t.ratios.n >= MIN_SAMPLES]
        for device in hosts:
            lessons.append(_operator_lesson(family, arm, outcomes, device))
        if not hosts and outcomes.judged >= MIN_SAMPLES:
            lessons.append(_operator_lesson(family, arm, outcomes, None))
    return lessons


def _operator_lesson(
    family: Family, arm: OperatorArm, outcomes: Outcomes, device: str | None
) -> Lesson:
    operator, name, value = arm
    who = f"{operator} with {name}={value!r}" if name else operator
    timed = outcomes.timed[device] if device is not None else Timed()
    data: dict[str, Any] = {
        "rule": RULE,
        "operator": operator,
        "param": name or None,
        "value": value,
        "family": {"target": family.target, "dtype": family.dtype, "dims": list(family.dims)},
        "device": device,
        "confidence": CONFIDENCE,
    }
    if device is None:
        said = f"{who}: no host timed {MIN_SAMPLES} of its children on {family.words()}"
    else:
        interval = mean_interval(timed.ratios)
        gain, low, high = (math.exp(x) for x in (interval.difference, interval.low, interval.high))
        significant = interval.excludes_zero
        shapes = len(timed.shapes)
        said = (
            f"{who} paid {gain:.2f}x over its parent ({CONFIDENCE:.0%} CI {low:.2f}x-"
            f"{high:.2f}x, n={timed.ratios.n}{'' if significant else ', not significant'}) "
            f"on {family.words()} ({device or 'unnamed host'}, {shapes} shape(s))"
        )
        data |= {
            "n": timed.ratios.n,
            "mean_log_ratio": timed.ratios.mean,
            "speedup": gain,
            "ci": [low, high],
            "df": interval.df if math.isfinite(interval.df) else None,
            "significant": significant,
            "shapes": shapes,
        }
    reject_low, reject_high = wilson_interval(outcomes.rejected, outcomes.judged)
    reason = outcomes.commonest_reason()
    said += (
        f"; {outcomes.rejected} of {outcomes.judged} judged rejected "
        f"({CONFIDENCE:.0%} CI {reject_low:.0%}-{reject_high:.0%})"
    )
    if reason is not None:
        said += f", commonest at {reason[0]} ({reason[1]}): {outcomes.reasons[reason]}"
    data |= {
        "judged": outcomes.judged,
        "rejected": outcomes.rejected,
        "rejected_ci": [reject_low, reject_high],
        "reason": None
        if reason is None
        else {"stage": reason[0], "reason": reason[1], "count": outcomes.reasons[reason]},
    }
    return Lesson(
        kind="operator",
        statement=said,
        evidence_ids=_bounded(timed.spread.ids() + outcomes.rejections.ids()),
        data=data,
    )


def _speedup(candidate: Candidate) -> float:
    assert candidate.benchmark is not None, "the lineage holds timed kernels"
    return figure_of(candidate.benchmark).speedup


def lineage(chain: list[Candidate]) -> list[Lesson]:
    """The kernels that became the campaign's best, in order: promoted by own time and
    head to head (`actors.campaign.ranking`), the rule `run`, `replay` and the audit follow.
    Each shows its figure (`leaderboard.figure_of`: the speedup over the baseline timed
    in its own run, as every view shows it), so a promotion may show a
    lower one than the kernel it replaced. A long chain shows its first two and its
    latest ones, `MAX_EVIDENCE` in all."""
    if not chain:
        return []
    head = MAX_EVIDENCE // 4
    shown = chain if len(chain) <= MAX_EVIDENCE else chain[:head] + chain[head - MAX_EVIDENCE :]
    steps = [f"{c.candidate_id} ({_speedup(c):.2f}x)" for c in shown]
    if len(shown) < len(chain):
        steps.insert(head, f"... ({len(chain) - len(shown)} more)")
    return [
        Lesson(
            kind="lineage",
            statement=f"best-so-far lineage: {' -> '.join(steps)}",
            evidence_ids=[c.benchmark.event_id for c in shown if c.benchmark],
            data={
                "rule": RULE,
                "chain": [c.candidate_id for c in shown],
                "promotions": len(chain),
                "best": chain[-1].candidate_id,
            },
        )
    ]
