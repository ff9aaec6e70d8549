"""Re-deriving what a campaign reported, from its events alone, and comparing.

Replays the history of the campaign's problem (every campaign of it: lessons draw on
them all) and, at the moment each claim was made, rebuilds what the claim should have
been: each generation's lessons and close (best candidate, counts), the dedupe answers,
the final run's order (its passing contenders by mean, its winner the leaderboard's rank
1), the finish reason and summary. Every kernel's source must hash to the identity that
later events name, and every benchmark's speedup must be its own baseline over its time
(the mean over the timed calls; the median in events recorded before the mean was kept).

It rebuilds them with the code the actors run: lessons with `draw_lessons`, each
close's best with `actors.campaign.ranking.best_of`, dedupe answers from the same
`History` index. Its claims are of the areas `projection` and `kernel`
(`eventstore/claims.py`).

Lessons are re-derived only for the generations recorded under a rule this code draws
with (`actors.search.lessons.RULES`, in each lesson's `data`), each under its own: rule
2's without the operator lessons rule 3 added. An older store's lessons (rule 1 had no
version) are reported as recorded under that rule and not re-derived, which agrees;
lessons of two rules in one generation, or of an older rule after a newer one in a
campaign, differ. Their statistics are compared within
`REL_TOLERANCE` (libm's last bits may differ between hosts), everything else exactly.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import msgspec

from actors.campaign.history import History
from actors.campaign.leaderboard import campaign_leaderboard, leaderboard
from actors.campaign.ranking import best_of
from actors.campaign.summary import spent_candidates, summary
from actors.search.lessons import RULE, RULES, Lesson, draw_lessons, lesson_rule, under_rule
from eventstore.claims import Claim, agrees, differs, skipped
from eventstore.events import (
    BenchmarkCompleted,
    CampaignFinished,
    CandidateDeduplicated,
    Event,
    FinalRankingTimed,
    GenerationClosed,
    KernelCompiled,
    KernelRejected,
    KernelVerified,
    KernelWritten,
    LessonLearned,
)
from kernels.identity import source_hash

MAX_DIFFERENCES = 10
REL_TOLERANCE = 1e-9


def _plain(value: Any) -> Any:
    """Data as it reads back from JSON (tuples become lists, and so on)."""
    return msgspec.json.decode(msgspec.json.encode(value))


def _lesson_of(lesson: Lesson | LessonLearned) -> list[Any]:
    return [lesson.kind, lesson.statement, list(lesson.evidence_ids), _plain(lesson.data)]


def _same(a: Any, b: Any) -> bool:
    """Plain data alike, floats within REL_TOLERANCE: a lesson's statistics come from
    `math.lgamma`, `exp` and `log`, whose last bits may differ between hosts' libm."""
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            and not isinstance(a, bool)
            and not isinstance(b, bool)
            and _close(float(a), float(b))
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b and type(a) is type(b))


class _Area:
    """The findings of one kind of claim: how many were checked, and which differ."""

    def __init__(self, area: str, name: str) -> None:
        self.area, self.name = area, name
        self.checked = 0
        self.differences: list[Claim] = []

    def check(self, ok: bool, evidence: str, position: int) -> None:
        self.checked += 1
        if not ok and len(self.differences) < MAX_DIFFERENCES:
            self.differences.append(differs(self.area, self.name, evidence, position))

    def claims(self, what: str, note: str = "") -> list[Claim]:
        if self.differences:
            return self.differences
        if self.checked == 0:
            return [skipped(self.area, self.name, f"no {what} recorded")]
        said = f"{self.checked} {what} re-derived, all equal" + (f"; {note}" if note else "")
        return [agrees(self.area, self.name, said)]


def audit_projections(events: Iterable[tuple[int, Event]], campaign_id: str) -> list[Claim]:
    """Rebuild every projection of `campaign_id` from `events` (the whole store, or at
    least every campaign of its problem, in position order) and compare with its claims."""
    history = History()
    board = _Area("projection", "leaderboard")
    dedupe = _Area("projection", "dedupe index")
    lessons = _Area("projection", "lessons")
    sources = _Area("kernel", "sources match their hashes")
    drawn: dict[int, tuple[int, list[Lesson]]] = {}
    told: dict[int, list[LessonLearned]] = defaultdict(list)
    finish: list[Claim] = []
    for position, event in events:
        if event.campaign_id == campaign_id and campaign_id in history.campaigns:
            if (
                isinstance(event, LessonLearned | GenerationClosed)
                and event.generation not in drawn
            ):
                drawn[event.generation] = (position, lessons_due(history, campaign_id))
            if isinstance(event, LessonLearned):
                told[event.generation].append(event)
            elif isinstance(event, GenerationClosed):
                _check_close(history, campaign_id, event, position, board)
            elif isinstance(event, CandidateDeduplicated):
                _check_duplicate(history, campaign_id, event, position, dedupe)
            elif isinstance(event, KernelWritten):
                _check_written(history, campaign_id, event, position, sources, dedupe)
            elif isinstance(event, KernelCompiled | KernelVerified | KernelRejected):
                _check_same_kernel(history, event, position, sources)
            elif isinstance(event, BenchmarkCompleted):
                _check_same_kernel(history, event, position, sources)
                _check_benchmark(event, position, board)
            elif isinstance(event, FinalRankingTimed):
                _check_final(history, campaign_id, event, position, board)
            elif isinstance(event, CampaignFinished):
                finish = _check_finish(history, campaign_id, event, position, board, dedupe)
        history.apply(position, event)
    if campaign_id not in history.campaigns:
        raise KeyError(f"no campaign {campaign_id!r} in the store")
    rules = _rules(sorted(drawn), told)
    not_rederived: dict[int, list[int]] = defaultdict(list)  # rule -> its generations
    newest: tuple[int, int] | None = None  # the latest rule re-derived, and its first generation
    for generation, (position, expected) in sorted(drawn.items()):
        rule = rules[generation]
        if rule is None:
            found = sorted({lesson_rule(x.data) for x in told[generation]})
            lessons.check(False, f"generation {generation}: lessons under rules {found}", position)
            continue
        if newest is not None and rule < newest[0]:
            lessons.check(
                False,
                f"generation {generation}: lessons under rule v{rule} after generation "
                f"{newest[1]}'s under rule v{newest[0]}",
                position,
            )
            continue
        if rule not in RULES:
            not_rederived[rule].append(generation)
            continue
        newest = newest if newest is not None and newest[0] == rule else (rule, generation)
        want = [_lesson_of(x) for x in under_rule(expected, rule)]
        got = [_lesson_of(x) for x in told[generation]]
        alike = len(want) == len(got) and all(map(_same, want, got))
        missing = [] if alike else [w[1] for w in want if not any(_same(w, g) for g in got)]
        extra = [] if alike else [g[1] for g in got if not any(_same(g, w) for w in want)]
        lessons.check(
            alike,
            f"generation {generation}: "
            + (f"not re-derived: {extra[:2]}" if extra else "")
            + ("; " if extra and missing else "")
            + (f"re-derived but not recorded: {missing[:2]}" if missing else "")
            + ("" if missing or extra else "same lessons in another order"),
            position,
        )
    campaign = history.campaigns[campaign_id]
    best = campaign_leaderboard(history, campaign_id).best
    if not finish:
        state = "running" if campaign.finished is None else "finished"
        finish = [skipped("projection", "finish reason", f"the campaign is {state}, not finished")]
    top = (
        f"best {best.candidate_id} at {best.speedup:.3f}x"
        if best is not None and best.speedup
        else "no timed kernel"
    )
    return [
        *board.claims("generation bests and benchmark figures", top),
        *dedupe.claims("duplicate answers and kernel identities"),
        *_lesson_claims(lessons, not_rederived),
        *sources.claims("kernel identities"),
        *finish,
    ]


def _rules(generations: list[int], told: dict[int, list[LessonLearned]]) -> dict[int, int | None]:
    """The rule each generation's lessons were drawn under (`lesson_rule`; None when they
    mix rules). A generation that recorded none was closed by the librarian of the
    nearest generation before it that recorded some (or else after it; or else today's)."""
    said = {g: {lesson_rule(x.data) for x in told[g]} for g in generations if told.get(g)}
    single = {g: next(iter(found)) for g, found in said.items() if len(found) == 1}
    last = next(iter(single.values()), RULE)
    rules: dict[int, int | None] = {}
    for g in generations:
        last = single.get(g, last)
        rules[g] = None if g in said and g not in single else last
    return rules


def _lesson_claims(lessons: _Area, not_rederived: dict[int, list[int]]) -> list[Claim]:
    """The lessons' claims. Generations recorded under another rule are skipped, named:
    this code draws lessons under its own rule only, so it has not checked them."""
    older = [
        skipped(
            lessons.area,
            lessons.name,
            f"{len(gs)} generation(s) recorded under rule v{rule} (generations "
            f"{gs[0]}-{gs[-1]}), not re-derived: this audit draws lessons under rules "
            + ", ".join(f"v{r}" for r in RULES),
        )
        for rule, gs in sorted(not_rederived.items())
    ]
    if older and not lessons.checked:
        return older
    return lessons.claims("generations' lessons") + older


def lessons_due(history: History, campaign_id: str) -> list[Lesson]:
    """What the librarian draws at this point (minus what the campaign already said)."""
    said = history.campaigns[campaign_id].said
    return [x for x in draw_lessons(history, campaign_id) if x.statement not in said]


def _check_close(
    history: History, campaign_id: str, event: GenerationClosed, position: int, board: _Area
) -> None:
    state = history.campaigns[campaign_id].generations.get(event.generation)
    members = [history.candidates[c] for c in state.candidates] if state else []
    best = best_of(members)
    expected = (
        len(members),
        sum(1 for c in members if c.evaluated),
        best.candidate_id if best else None,
        best.speedup if best else None,
    )
    told = (event.settled, event.evaluated, event.best_candidate, event.best_speedup)
    board.check(
        expected == told,
        f"generation {event.generation} closed with (settled, evaluated, best, speedup) "
        f"{told}; its events give {expected}",
        position,
    )


def _check_duplicate(
    history: History,
    campaign_id: str,
    event: CandidateDeduplicated,
    position: int,
    dedupe: _Area,
) -> None:
    earlier = history.seen_source(campaign_id, event.source_hash, event.candidate_id)
    outcome = earlier.outcome_event if earlier else None
    dedupe.check(
        outcome is not None and outcome.event_id == event.duplicate_of,
        f"{event.candidate_id} was deduplicated as a copy of {event.duplicate_of}, but the "
        + (
            f"earlier kernel with that source was settled by {outcome.event_id}"
            if outcome
            else "history holds no earlier settled kernel with that source"
        ),
        position,
    )


def _check_written(
    history: History,
    campaign_id: str,
    event: KernelWritten,
    position: int,
    sources: _Area,
    dedupe: _Area,
) -> None:
    actual = source_hash(event.source, event.flags)
    sources.check(
        actual == event.source_hash,
        f"{event.candidate_id}: its source and flags hash to {actual[:16]}..., "
        f"the event names {event.source_hash[:16]}...: the source was altered",
        position,
    )
    earlier = history.seen_source(campaign_id, event.source_hash, event.candidate_id)
    dedupe.check(
        earlier is None or earlier.outcome_event is None,
        f"{event.candidate_id} was evaluated although {earlier.candidate_id if earlier else ''} "
        "had already settled the same kernel",
        position,
    )


def _check_same_kernel(
    history: History,
    event: KernelCompiled | KernelVerified | KernelRejected | BenchmarkCompleted,
    position: int,
    sources: _Area,
) -> None:
    candidate = history.candidates.get(event.candidate_id)
    written = candidate.written if candidate else None
    if written is None:
        return  # a rejection before any kernel was written (the writer's own)
    sources.check(
        written.source_hash == event.source_hash,
        f"{event.type} of {event.candidate_id} names kernel {event.source_hash[:16]}..., "
        f"but the kernel written for it is {written.source_hash[:16]}...",
        position,
    )


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOLERANCE)


def _check_benchmark(event: BenchmarkCompleted, position: int, board: _Area) -> None:
    """The speedup and roofline fraction re-derived under the rule the event was recorded
    with: from the means over the timed calls where it holds them, else from the medians
    (events recorded before the means were kept)."""
    rule = "median" if event.mean_ns is None else "mean"
    kernel, baseline = event.time_ns, event.baseline_time_ns
    ratio = baseline / kernel if kernel > 0 else math.inf
    board.check(
        _close(ratio, event.speedup),
        f"{event.candidate_id}: speedup {event.speedup:.4g} is not baseline/{rule} "
        f"{baseline:.6g}/{kernel:.6g} = {ratio:.4g}",
        position,
    )
    floor = event.roofline_ns
    if floor is not None and kernel > 0:
        board.check(
            _close(floor / kernel, event.roofline_fraction),
            f"{event.candidate_id}: roofline fraction {event.roofline_fraction:.4g} is not "
            f"roofline/{rule} {floor:.6g}/{kernel:.6g}",
            position,
        )


def _check_final(
    history: History, campaign_id: str, event: FinalRankingTimed, position: int, board: _Area
) -> None:
    """A final run's order re-derived from its contenders' figures: those that passed
    their judged calls, by mean, fastest first; and the leaderboard, once it holds the
    run, ranks its winner first."""
    passed = [c for c in event.contenders if not c.failure]
    expected = [c.candidate_id for c in sorted(passed, key=lambda c: c.mean_ns)]
    board.check(
        expected == event.order,
        f"final run: order {event.order} is not its passing contenders by mean {expected}",
        position,
    )
    best = leaderboard(history.campaign_candidates(campaign_id), event).best
    board.check(
        best is not None and bool(event.order) and best.candidate_id == event.order[0],
        f"final run: the leaderboard's rank 1 is "
        f"{best.candidate_id if best else None}, not the run's winner "
        f"{event.order[0] if event.order else None}",
        position,
    )


_WALL = re.compile(r"wall time reached: ([\d.]+) s")


def _check_finish(
    history: History,
    campaign_id: str,
    event: CampaignFinished,
    position: int,
    board: _Area,
    dedupe: _Area,
) -> list[Claim]:
    campaign = history.campaigns[campaign_id]
    expected = _plain(summary(history, campaign))
    told = _plain(event.summary)
    claims: list[Claim] = []
    if expected.get("best") != told.get("best"):
        board.check(
            False,
            f"the campaign reported best {told.get('best')}; its events give "
            f"{expected.get('best')}",
            position,
        )
    if expected.get("duplicates_avoided") != told.get("duplicates_avoided"):
        dedupe.check(
            False,
            f"reported {told.get('duplicates_avoided')} duplicates avoided; the events hold "
            f"{expected.get('duplicates_avoided')}",
            position,
        )
    others = {k: v for k, v in expected.items() if k not in ("best", "duplicates_avoided")}
    told_others = {k: told.get(k) for k in others}
    claims.append(
        agrees("projection", "summary", f"{others}", position)
        if others == told_others
        else differs(
            "projection", "summary", f"reported {told_others}; the events give {others}", position
        )
    )
    claims.append(_finish_reason(history, campaign_id, event, position))
    return claims


def _finish_reason(
    history: History, campaign_id: str, event: CampaignFinished, position: int
) -> Claim:
    campaign = history.campaigns[campaign_id]
    spec = campaign.spec
    spent = spent_candidates(history, campaign)
    reason = event.reason
    name = "finish reason"
    if spent >= spec.budget.candidates:
        expected = f"budget reached: {spent} candidates"
        if reason == expected:
            return agrees("projection", name, f"{reason!r}: {spent} candidates spent", position)
        return differs("projection", name, f"reported {reason!r}; the events give {expected!r}")
    wall = _WALL.fullmatch(reason)
    if wall:
        elapsed = (event.ts - campaign.started.ts).total_seconds()
        limit = spec.budget.wall_seconds()
        ok = limit <= float(wall.group(1)) <= elapsed + 1.0
        return (agrees if ok else differs)(
            "projection",
            name,
            f"{reason!r}; limit {limit:.0f} s, {elapsed:.0f} s between start and finish",
            position,
        )
    best = history.best(campaign_id)
    if reason.startswith("roofline target reached"):
        fraction = best.benchmark.roofline_fraction if best and best.benchmark else 0.0
        ok = fraction >= spec.budget.stop_at_roofline
        return (agrees if ok else differs)(
            "projection",
            name,
            f"{reason!r}; the best kernel's roofline fraction is {fraction:.0%} against "
            f"{spec.budget.stop_at_roofline:.0%}",
            position,
        )
    return skipped(
        "projection",
        name,
        f"{reason!r}: depends on the search's proposals, which only a rerun can re-derive; "
        f"{spent} of {spec.budget.candidates} candidates were spent",
        position,
    )
