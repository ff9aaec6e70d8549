"""What each variation operator's children came to, per problem scope, kept as the
history grows, each of a fixed size; the operator lessons (`actors.search.lessons`) and
the bandit's family prior (`actors.search.operator_bandit.family_prior`) are drawn from
them.

An `OperatorBook` belongs to one `History` (`OperatorBook.of`) and, like the lessons'
`LessonBook` (both an `actors.search.lesson_tally.Book`), reads its outcome log on from
where it stopped, into one `OperatorTally` per scope (problem, target, dtype). Per
`OperatorArm` (an operator, or one value of one of its parameters) it keeps:
- per device that timed them, the moments of `log(parent median / child median)` over
  the children whose first parent was timed, a `Spread` of them and the shapes they were
  timed at;
- how many children were judged (verified, or rejected beyond the write stage: a refusal
  wrote no kernel) and how many were rejected, by stage and reason, with a bounded sample
  of the rejections.
The scopes of one family (`actors.search.problem_family`) are merged when a lesson or a
prior is drawn: a problem's family is known only once one of its kernels was timed, and
its children judged before that count all the same. An event is counted where it stands
in the log (its index there orders the samples), so every reader computes the same floats.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from actors.campaign.history import Candidate, History
from actors.search.lesson_stats import Moments
from actors.search.lesson_tally import SAMPLE, Book, Spread
from actors.search.lineage import is_operator_proposal
from actors.search.problem_family import Family
from eventstore.events import BenchmarkCompleted, Event, KernelRejected, KernelVerified

OperatorArm = tuple[str, str, Any]
"""An operator with one of its parameter values, (operator, name, value), or the operator
itself, (operator, "", None)."""
Shape = tuple[tuple[str, int], ...]


def log_ratio(history: History, child: Candidate) -> float | None:
    """`log(parent median / child median)` of a timed child whose first parent was timed
    (what the child gained over the kernel it was varied from); None otherwise."""
    parents = child.proposal.parents
    parent = history.candidates.get(parents[0]) if parents else None
    if child.benchmark is None or parent is None or parent.benchmark is None:
        return None
    if child.benchmark.median_ns <= 0 or parent.benchmark.median_ns <= 0:
        return None
    return math.log(parent.benchmark.median_ns / child.benchmark.median_ns)


def arms_of(candidate: Candidate) -> list[OperatorArm]:
    """The operator's arm, and one per parameter value (a scalar: a recorded list or
    mapping names no value an operator's space offers)."""
    proposal = candidate.proposal
    values = [
        (proposal.operator, name, value)
        for name, value in sorted(proposal.params.items())
        if isinstance(value, int | float | str)  # bool is an int
    ]
    return [(proposal.operator, "", None), *values]


@dataclass
class Rejections:
    """A bounded sample of rejections, (order counted, event id): the first and the latest
    `SAMPLE`; merged in the order they were counted."""

    first: list[tuple[int, str]] = field(default_factory=list)
    latest: list[tuple[int, str]] = field(default_factory=list)

    def add(self, item: tuple[int, str]) -> None:
        if len(self.first) < SAMPLE:
            self.first.append(item)
        else:
            self.latest = [*self.latest, item][-SAMPLE:]

    @classmethod
    def merged(cls, samples: Iterable[Rejections]) -> Rejections:
        out = cls()
        for item in sorted({i for s in samples for i in (*s.first, *s.latest)}):
            out.add(item)
        return out

    def ids(self) -> list[str]:
        return [i[1] for i in (*self.first, *self.latest)]


@dataclass
class Timed:
    """An arm's children timed on one device."""

    ratios: Moments = field(default_factory=Moments)
    spread: Spread = field(default_factory=Spread)
    shapes: set[Shape] = field(default_factory=set)

    @classmethod
    def merged(cls, parts: list[Timed]) -> Timed:
        if len(parts) == 1:
            return parts[0]
        return cls(
            Moments.merged(p.ratios for p in parts),
            Spread.merged(p.spread for p in parts),
            set().union(*(p.shapes for p in parts)),
        )


@dataclass
class Outcomes:
    """What one arm's children came to (see the module's docstring)."""

    timed: dict[str, Timed] = field(default_factory=dict)
    judged: int = 0
    rejected: int = 0
    reasons: Counter[tuple[str, str]] = field(default_factory=Counter)
    rejections: Rejections = field(default_factory=Rejections)

    @classmethod
    def merged(cls, parts: list[Outcomes]) -> Outcomes:
        if len(parts) == 1:
            return parts[0]
        devices = sorted({d for p in parts for d in p.timed})
        return cls(
            {d: Timed.merged([p.timed[d] for p in parts if d in p.timed]) for d in devices},
            sum(p.judged for p in parts),
            sum(p.rejected for p in parts),
            sum((p.reasons for p in parts), Counter()),
            Rejections.merged(p.rejections for p in parts),
        )

    def commonest_reason(self) -> tuple[str, str] | None:
        if not self.reasons:
            return None
        return min(self.reasons.items(), key=lambda r: (-r[1], r[0]))[0]


@dataclass
class OperatorTally:
    """One scope's operator children, per arm (see the module's docstring)."""

    arms: dict[OperatorArm, Outcomes] = field(default_factory=dict)

    def _outcomes(self, candidate: Candidate) -> list[Outcomes]:
        found = []
        for arm in arms_of(candidate):
            outcomes = self.arms.get(arm)
            if outcomes is None:
                outcomes = self.arms[arm] = Outcomes()
            found.append(outcomes)
        return found

    def judge(self, candidate: Candidate) -> None:
        if is_operator_proposal(candidate):
            for outcomes in self._outcomes(candidate):
                outcomes.judged += 1

    def reject(self, candidate: Candidate, event: KernelRejected, order: int) -> None:
        if not is_operator_proposal(candidate):
            return
        for outcomes in self._outcomes(candidate):
            outcomes.rejected += 1
            outcomes.reasons[(event.stage, event.reason)] += 1
            outcomes.rejections.add((order, event.event_id))

    def time(
        self, history: History, candidate: Candidate, event: BenchmarkCompleted, order: int
    ) -> None:
        x = log_ratio(history, candidate) if is_operator_proposal(candidate) else None
        if x is None:
            return
        shape = tuple(sorted(event.shape.items()))
        for outcomes in self._outcomes(candidate):
            timed = outcomes.timed.get(event.device)
            if timed is None:
                timed = outcomes.timed[event.device] = Timed()
            timed.ratios.add(x)
            timed.spread.add((order, x, event.event_id))
            timed.shapes.add(shape)


Scope = tuple[str, str, str]
"""A problem, target and dtype."""


class OperatorBook(Book):
    """Every scope's operator tallies of one history, and each problem's family, caught
    up on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.scopes: dict[Scope, OperatorTally] = {}
        self.dims: dict[Scope, tuple[str, ...]] = {}
        self._judged: set[str] = set()

    def family(self, scope: Scope) -> Family | None:
        dims = self.dims.get(scope)
        return None if dims is None else Family(scope[1], scope[2], dims)

    def arms(self, family: Family, besides: Scope | None = None) -> dict[OperatorArm, Outcomes]:
        """The arms of the family's problems (less `besides`) as one, in a fixed order."""
        tallies = [
            tally
            for scope, tally in sorted(self.scopes.items())
            if scope != besides and self.family(scope) == family
        ]
        arms = sorted({a for t in tallies for a in t.arms}, key=str)
        return {a: Outcomes.merged([t.arms[a] for t in tallies if a in t.arms]) for a in arms}

    def take(self, history: History, candidate: Candidate, event: Event, order: int) -> None:
        p = candidate.proposal
        scope = (p.problem, p.target, p.dtype)
        tally = self.scopes.get(scope)
        if tally is None:
            tally = self.scopes[scope] = OperatorTally()
        if isinstance(event, KernelVerified | KernelRejected):
            rejected = candidate.rejected is event
            if isinstance(event, KernelRejected) and event.stage == "write":
                return  # a refusal: no kernel was judged
            if candidate.candidate_id not in self._judged:
                self._judged.add(candidate.candidate_id)
                tally.judge(candidate)
            if rejected:
                assert isinstance(event, KernelRejected)
                tally.reject(candidate, event, order)
        elif isinstance(event, BenchmarkCompleted) and candidate.benchmark is event:
            if event.shape and scope not in self.dims:
                self.dims[scope] = tuple(sorted(event.shape))
            tally.time(history, candidate, event, order)
