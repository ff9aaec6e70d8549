"""Lessons drawn from the history of one problem and target, each citing its evidence.

- parameter effects: how each template parameter value moves the speedup, with the
  effect size (difference of mean log-speedups in pooled standard deviations);
- failure signatures: rejections grouped by stage, reason and first message line, and
  parameter values under which candidates always failed (the planner avoids those);
- lineage: the candidates that became the campaign's best (own time, head to head), in
  order.

Effects and failures are drawn over every candidate of the problem, target and dtype (all
campaigns); the lineage over this campaign's. An effect needs `MIN_SAMPLES` candidates on
each side and an effect size of at least `MIN_EFFECT`; a value is to be avoided when
every one of at least `MIN_SAMPLES` evaluated candidates with it was rejected at
compile, static, run or compare. Each lesson cites the ids of the events it was drawn
from. The librarian emits them when it closes a generation; the audit re-derives them
with this same `draw_lessons`.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from actors.campaign.history import Candidate, History
from actors.campaign.ranking import promotions

MIN_SAMPLES = 2
MIN_EFFECT = 0.5


@dataclass(frozen=True)
class Lesson:
    kind: str
    statement: str
    evidence_ids: list[str]
    data: dict[str, Any] = field(default_factory=dict)


def draw_lessons(history: History, campaign_id: str) -> list[Lesson]:
    campaign = history.campaigns[campaign_id]
    scope = history.scope_candidates(
        campaign.spec.problem, campaign.spec.target, campaign.spec.dtype
    )
    return [
        *parameter_effects(scope),
        *failure_signatures(scope),
        *avoided_regions(scope),
        *lineage(history.campaign_candidates(campaign_id)),
    ]


def _by_value(candidates: list[Candidate]) -> dict[tuple[str, str, Any], list[Candidate]]:
    groups: dict[tuple[str, str, Any], list[Candidate]] = defaultdict(list)
    for c in candidates:
        for name, value in c.proposal.params.items():
            groups[(c.proposal.template, name, value)].append(c)
    return groups


def _group_order(item: tuple[tuple[str, str, Any], list[Candidate]]) -> str:
    """Groups in the order of their keys' text: the order `key=str` gave, without
    printing every candidate of every group."""
    return str(item[0])


def parameter_effects(scope: list[Candidate]) -> list[Lesson]:
    timed = [c for c in scope if c.benchmark and c.benchmark.speedup > 0]
    logs = {id(c): math.log(c.speedup or 1.0) for c in timed}
    by_template: dict[str, list[Candidate]] = defaultdict(list)
    for c in timed:
        by_template[c.proposal.template].append(c)
    columns: dict[tuple[str, str], list[Any]] = {}
    # A group and its others are all of the template's timed candidates, and pstdev is
    # exact (order-free), so each template's spread is computed once.
    spreads: dict[str, float] = {}
    lessons = []
    for (template, name, value), group in sorted(_by_value(timed).items(), key=_group_order):
        if len(group) < MIN_SAMPLES:
            continue
        members = by_template[template]
        column = columns.get((template, name))
        if column is None:
            column = columns[(template, name)] = [c.proposal.params.get(name) for c in members]
        others = [c for c, v in zip(members, column, strict=True) if v != value]
        if len(others) < MIN_SAMPLES:
            continue
        with_value = [logs[id(c)] for c in group]
        without = [logs[id(c)] for c in others]
        if template not in spreads:
            spreads[template] = statistics.pstdev([logs[id(c)] for c in members])
        spread = spreads[template] or 1e-9
        effect = (statistics.fmean(with_value) - statistics.fmean(without)) / spread
        if abs(effect) < MIN_EFFECT:
            continue
        ratio = math.exp(statistics.fmean(with_value) - statistics.fmean(without))
        lessons.append(
            Lesson(
                kind="parameter_effect",
                statement=(
                    f"{template}: {name}={value!r} gives {ratio:.2f}x the speedup of other "
                    f"values (effect size {effect:+.2f}, n={len(group)} vs {len(others)})"
                ),
                evidence_ids=[c.benchmark.event_id for c in group + others if c.benchmark],
                data={
                    "template": template,
                    "param": name,
                    "value": value,
                    "effect_size": effect,
                    "speedup_ratio": ratio,
                    "n": len(group),
                },
            )
        )
    return lessons


def _signature(message: str) -> str:
    first = (message.strip().splitlines() or [""])[0]
    return re.sub(r"\d+", "N", first)[:160]


def failure_signatures(scope: list[Candidate]) -> list[Lesson]:
    groups: dict[tuple[str, str, str], list[Candidate]] = defaultdict(list)
    for c in scope:
        if c.rejected:
            message = str(c.rejected.evidence.get("message", ""))
            groups[(c.rejected.stage, c.rejected.reason, _signature(message))].append(c)
    return [
        Lesson(
            kind="failure_signature",
            statement=(
                f"{len(group)} candidate(s) rejected at {stage} ({reason})"
                + (f": {signature}" if signature else "")
            ),
            evidence_ids=[c.rejected.event_id for c in group if c.rejected],
            data={"stage": stage, "reason": reason, "signature": signature, "count": len(group)},
        )
        for (stage, reason, signature), group in sorted(groups.items())
    ]


def avoided_regions(scope: list[Candidate]) -> list[Lesson]:
    """Parameter values whose every evaluated candidate failed to compile or verify."""
    evaluated = [c for c in scope if c.evaluated]
    lessons = []
    for (template, name, value), group in sorted(_by_value(evaluated).items(), key=_group_order):
        failed = [
            c
            for c in group
            if c.rejected and c.rejected.stage in ("compile", "static", "run", "compare")
        ]
        if len(group) >= MIN_SAMPLES and len(failed) == len(group):
            stages = sorted({c.rejected.stage for c in failed if c.rejected})
            lessons.append(
                Lesson(
                    kind="failure_signature",
                    statement=(
                        f"{template}: every candidate with {name}={value!r} failed "
                        f"({', '.join(stages)}; n={len(group)}): avoid it"
                    ),
                    evidence_ids=[c.rejected.event_id for c in failed if c.rejected],
                    data={"template": template, "param": name, "value": value, "avoid": True},
                )
            )
    return lessons


def lineage(candidates: list[Candidate]) -> list[Lesson]:
    """The kernels that became the campaign's best, in order: promoted by own time and
    head to head (`actors.campaign.ranking`), the rule `run`, `replay` and the audit follow. Each
    shows its recorded speedup (over its own baseline), so a promotion may show a lower
    one than the kernel it replaced."""
    chain = promotions(candidates)
    if not chain:
        return []
    steps = " -> ".join(f"{c.candidate_id} ({c.speedup:.2f}x)" for c in chain)
    return [
        Lesson(
            kind="lineage",
            statement=f"best-so-far lineage: {steps}",
            evidence_ids=[c.benchmark.event_id for c in chain if c.benchmark],
            data={"chain": [c.candidate_id for c in chain], "best": chain[-1].candidate_id},
        )
    ]
