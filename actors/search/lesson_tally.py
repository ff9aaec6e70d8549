"""The tallies lessons are drawn from, kept as a history grows, each of a fixed size.

A `LessonBook` belongs to one `History` (`LessonBook.of`): it reads the history's
`outcome_log` on from where it stopped, so drawing lessons at every generation's close
costs what happened since the last draw, not a walk over every kernel again (the walk
made replaying a large campaign quadratic). Per scope (problem, target, dtype) a
`ScopeTally` keeps:
- per template, and per value of each template parameter, the moments of the timed
  kernels' log speedups and a `Spread` (the first two, the fastest, the slowest);
- per template and `Feature` (a parameter value, or a compiler flag the kernel was built
  with): how many were evaluated and how many failed as wrong kernels (rejected at
  compile, static, run or compare), by stage, reason and first message line, the
  features every failure of a reason shared, and `Ends` (the first and latest rejections);
- per rejection signature (stage, reason, first message line): the count and its `Ends`.
Per campaign a `RunningBest` (`actors.campaign.ranking`) extends the promotion walk as
its kernels are timed.

An event is counted where it stands in the log, whenever the book catches up, so the
librarian and the audit, replaying the same events, compute the same floats.
"""

from __future__ import annotations

import math
import re
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, ClassVar, Self
from weakref import WeakKeyDictionary

from actors.campaign.history import Candidate, History
from actors.campaign.ranking import RunningBest
from actors.search.lesson_stats import Moments
from actors.search.priors import WRONG_KERNEL_STAGES
from eventstore.events import BenchmarkCompleted, Event, KernelRejected, KernelVerified

SAMPLE = 4
"""Rejections an `Ends` keeps at each end; a `Spread` keeps the first SAMPLE // 2."""

Reason = tuple[str, str]
"""A rejection's stage and reason."""
Signature = tuple[str, str, str]
"""A rejection's stage, reason and first message line (digits as N)."""


Feature = tuple[str, str, Any]
"""What a kernel was made with: ("param", name, value), a template parameter's value, or
("flag", flag, True), a compiler flag it was built with."""


def feature_words(feature: Feature) -> str:
    kind, name, value = feature
    return f"{name}={value!r}" if kind == "param" else f"flag {name}"


def features_of(candidate: Candidate) -> list[Feature]:
    params = [("param", name, value) for name, value in candidate.proposal.params.items()]
    flags = candidate.written.flags if candidate.written else []
    return params + [("flag", flag, True) for flag in dict.fromkeys(flags)]


def signature_of(event: KernelRejected) -> Signature:
    message = str(event.evidence.get("message", ""))
    first = (message.strip().splitlines() or [""])[0]
    return event.stage, event.reason, re.sub(r"\d+", "N", first)[:160]


@dataclass
class Ends:
    """A bounded sample of event ids: the first SAMPLE and the latest SAMPLE."""

    first: list[str] = field(default_factory=list)
    latest: deque[str] = field(default_factory=lambda: deque(maxlen=SAMPLE))

    def add(self, event_id: str) -> None:
        (self.first if len(self.first) < SAMPLE else self.latest).append(event_id)

    def ids(self) -> list[str]:
        return [*self.first, *self.latest]


@dataclass
class Spread:
    """A bounded sample of timed kernels: the first ones, the slowest and the fastest,
    each as (order counted, log speedup, event id)."""

    first: list[tuple[int, float, str]] = field(default_factory=list)
    low: tuple[int, float, str] | None = None
    high: tuple[int, float, str] | None = None

    def add(self, item: tuple[int, float, str]) -> None:
        if len(self.first) < SAMPLE // 2:
            self.first.append(item)
        if self.low is None or item[1] < self.low[1]:
            self.low = item
        if self.high is None or item[1] > self.high[1]:
            self.high = item

    @classmethod
    def merged(cls, spreads: Iterable[Spread]) -> Spread:
        """The spread of a union of samples (the others of a parameter value)."""
        out = cls()
        for item in sorted({i for s in spreads for i in (*s.first, s.low, s.high) if i}):
            out.add(item)
        return out

    def ids(self) -> list[str]:
        ends = [i for i in (self.low, self.high) if i is not None]
        return list(dict.fromkeys(i[2] for i in (*ends, *self.first)))


@dataclass
class TimedValue:
    moments: Moments = field(default_factory=Moments)
    spread: Spread = field(default_factory=Spread)


@dataclass
class FeatureTally:
    """The wrong-kernel failures of one template's kernels with a feature."""

    failed: int = 0
    signatures: Counter[Signature] = field(default_factory=Counter)
    reasons: Counter[Reason] = field(default_factory=Counter)
    shared: dict[Reason, set[Feature]] = field(default_factory=dict)
    """Per reason, the features every such failure with this feature also had."""
    rejections: Ends = field(default_factory=Ends)


@dataclass
class SignatureTally:
    count: int = 0
    rejections: Ends = field(default_factory=Ends)


@dataclass
class ScopeTally:
    """Fixed-size summaries of a scope's kernels (see the module's docstring)."""

    order: int = 0
    """Timed kernels counted so far (a `Spread` orders its kernels by it)."""
    timed: dict[str, Moments] = field(default_factory=dict)
    values: dict[tuple[str, str, Any], TimedValue] = field(default_factory=dict)
    values_of: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    """Per template and parameter, its timed values in the order first seen."""
    evaluated: Counter[str] = field(default_factory=Counter)
    evaluated_with: Counter[tuple[str, Feature]] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    failed_for: Counter[tuple[str, Reason]] = field(default_factory=Counter)
    features: dict[tuple[str, Feature], FeatureTally] = field(default_factory=dict)
    signatures: dict[Signature, SignatureTally] = field(default_factory=dict)
    judged: int = 0

    @classmethod
    def of(cls, candidates: Iterable[Candidate]) -> ScopeTally:
        """The tally of these candidates as they stand, in this order."""
        tally = cls()
        for c in candidates:
            features = features_of(c)
            if c.evaluated:
                tally.evaluate(c, features)
            if c.rejected is not None:
                tally.reject(c, c.rejected, features)
            if c.benchmark is not None:
                tally.time(c, c.benchmark)
        return tally

    def evaluate(self, candidate: Candidate, features: list[Feature]) -> None:
        template = candidate.proposal.template
        self.judged += 1
        self.evaluated[template] += 1
        self.evaluated_with.update([(template, feature) for feature in features])

    def reject(self, candidate: Candidate, event: KernelRejected, features: list[Feature]) -> None:
        signature = signature_of(event)
        group = self.signatures.get(signature)
        if group is None:
            group = self.signatures[signature] = SignatureTally()
        group.count += 1
        group.rejections.add(event.event_id)
        if event.stage not in WRONG_KERNEL_STAGES:
            return
        template, reason = candidate.proposal.template, (event.stage, event.reason)
        self.failed[template] += 1
        self.failed_for[(template, reason)] += 1
        for feature in features:
            tally = self.features.get((template, feature))
            if tally is None:
                tally = self.features[(template, feature)] = FeatureTally()
            tally.failed += 1
            tally.signatures[signature] += 1
            tally.reasons[reason] += 1
            tally.rejections.add(event.event_id)
            shared = tally.shared.get(reason)
            if shared is None:
                tally.shared[reason] = set(features)
            else:
                shared.intersection_update(features)

    def time(self, candidate: Candidate, event: BenchmarkCompleted) -> None:
        if event.speedup <= 0:
            return
        template, x = candidate.proposal.template, math.log(event.speedup)
        self.order += 1
        item = (self.order, x, event.event_id)
        moments = self.timed.get(template)
        if moments is None:
            moments = self.timed[template] = Moments()
        moments.add(x)
        for name, value in candidate.proposal.params.items():
            key = (template, name, value)
            group = self.values.get(key)
            if group is None:
                group = self.values[key] = TimedValue()
                self.values_of.setdefault((template, name), []).append(value)
            group.moments.add(x)
            group.spread.add(item)


class Book:
    """Tallies of one history's outcome log, read on from where they stopped: `of` gives
    each subclass's book of a history, caught up with every event applied to it."""

    _books: ClassVar[WeakKeyDictionary[History, Any]]
    """Each subclass's books, by history."""

    def __init__(self) -> None:
        self.read = 0

    def __init_subclass__(cls) -> None:
        cls._books = WeakKeyDictionary()

    @classmethod
    def of(cls, history: History) -> Self:
        book: Self | None = cls._books.get(history)
        if book is None:
            book = cls._books[history] = cls()
        log = islice(history.outcome_log, book.read, None)
        for order, (candidate, event) in enumerate(log, book.read):
            book.take(history, candidate, event, order)
        book.read = len(history.outcome_log)
        return book

    def take(self, history: History, candidate: Candidate, event: Event, order: int) -> None:
        """Count one event of the log (its index there is `order`)."""
        raise NotImplementedError


class LessonBook(Book):
    """Every scope's and campaign's tallies of one history, caught up on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.scopes: dict[tuple[str, str, str], ScopeTally] = {}
        self.lineages: dict[str, RunningBest] = {}
        self._evaluated: set[str] = set()

    def scope(self, problem: str, target: str, dtype: str) -> ScopeTally:
        found = self.scopes.get((problem, target, dtype))
        if found is None:
            found = self.scopes[(problem, target, dtype)] = ScopeTally()
        return found

    def lineage(self, campaign_id: str) -> RunningBest:
        """The campaign's promotion walk, as its kernels were timed."""
        found = self.lineages.get(campaign_id)
        if found is None:
            found = self.lineages[campaign_id] = RunningBest()
        return found

    def take(self, history: History, candidate: Candidate, event: Event, order: int) -> None:
        p = candidate.proposal
        if isinstance(event, KernelVerified | KernelRejected):
            tally = self.scope(p.problem, p.target, p.dtype)
            first = candidate.candidate_id not in self._evaluated
            rejected = candidate.rejected is event
            if first or rejected:
                features = features_of(candidate)
                if first:
                    self._evaluated.add(candidate.candidate_id)
                    tally.evaluate(candidate, features)
                if rejected:
                    assert isinstance(event, KernelRejected)
                    tally.reject(candidate, event, features)
        elif isinstance(event, BenchmarkCompleted) and candidate.benchmark is event:
            self.scope(p.problem, p.target, p.dtype).time(candidate, event)
            self.lineage(p.campaign_id).add(candidate)
