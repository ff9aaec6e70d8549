"""What earlier campaigns of a problem say about the points of its design spaces: the
prior a new campaign's search starts from.

Each earlier campaign of the same problem, target and dtype is one context: its
candidates, timed at its own shape on its own hosts. Within a context a point's quality
is its speed relative to the context's fastest kernel (1 for that kernel, 0 for a kernel
that was rejected; `actors.campaign.ranking.relative_speeds`), so contexts at different
shapes and on different hosts, whose times differ in scale, speak in one unit. A context
counts by its similarity to the campaign being searched:
- shape: the geometric mean over extents of smaller over larger (1 for the same shape;
  unknown counts 1/2);
- host: 1 when the context was timed on a device this campaign has been timed on, 1/2
  when not; before this campaign has any timing every host counts as 1 (any benchmarker
  may take its kernels).

From that:
- `ranked`: the points earlier contexts found best, by similarity-weighted quality, that
  a warm start proposes first;
- `refused`: the points an earlier context rejected at compile, static checks, run or
  comparison (the kernel itself was wrong, whatever the shape or host): never proposed;
- `trials`: every earlier outcome, least similar context first, for the search's study.

Everything is a pure function of the history, in its order: the same history gives the
same prior, so a resumed campaign proposes what it would have. With no earlier campaign
the prior is empty and costs one pass over the candidates.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from actors.campaign.history import Candidate
from actors.campaign.ranking import relative_speeds

WRONG_KERNEL_STAGES = ("compile", "static", "run", "compare")
"""Stages whose rejection says the kernel itself is wrong (other stages, such as timing
or the re-check of a fast kernel, can be the host's doing)."""
UNKNOWN_SIMILARITY = 0.5
OTHER_HOST = 0.5


@dataclass(frozen=True)
class Outcome:
    """One earlier evaluation, in the prior's units."""

    candidate: Candidate
    quality: float
    """Speed relative to its context's fastest kernel; 0 if rejected."""
    weight: float
    """Its context's similarity to the campaign searched (0..1]."""


@dataclass
class Context:
    campaign_id: str
    candidates: list[Candidate] = field(default_factory=list)

    def timed(self) -> list[Candidate]:
        return [c for c in self.candidates if c.benchmark is not None]

    def shape(self) -> tuple[int, ...] | None:
        """The extents most of its kernels were timed at."""
        shapes = Counter(_extents(c) for c in self.timed())
        shapes.pop(None, None)
        return shapes.most_common(1)[0][0] if shapes else None

    def devices(self) -> set[str]:
        return {c.benchmark.device for c in self.timed() if c.benchmark and c.benchmark.device}


def _extents(candidate: Candidate) -> tuple[int, ...] | None:
    assert candidate.benchmark is not None
    shape = candidate.benchmark.shape
    return tuple(shape.values()) if shape else None


def shape_similarity(a: Sequence[int] | None, b: Sequence[int] | None) -> float:
    if a is None or b is None:
        return UNKNOWN_SIMILARITY
    if len(a) != len(b):
        return UNKNOWN_SIMILARITY / 2
    ratios = [min(x, y) / max(x, y) for x, y in zip(a, b, strict=True) if max(x, y) > 0]
    return math.prod(ratios) ** (1 / len(ratios)) if ratios else UNKNOWN_SIMILARITY


@dataclass(frozen=True)
class Prior:
    outcomes: list[Outcome]
    """Earlier campaigns' settled candidates, least similar context first."""

    @property
    def empty(self) -> bool:
        return not self.outcomes

    def refused(self) -> set[str]:
        return {
            o.candidate.proposal.param_key
            for o in self.outcomes
            if o.candidate.rejected is not None
            and o.candidate.rejected.stage in WRONG_KERNEL_STAGES
        }

    def ranked(self, floor: float) -> list[tuple[str, float]]:
        """(param key, score) of points whose similarity-weighted mean quality is at least
        `floor`, best first (then the better known, then by key)."""
        weighted: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        refused = self.refused()
        for o in self.outcomes:
            key = o.candidate.proposal.param_key
            weighted[key] += o.weight * o.quality
            weights[key] += o.weight
        scores = [
            (key, weighted[key] / weights[key], weights[key])
            for key in weights
            if key not in refused and weights[key] > 0
        ]
        scores.sort(key=lambda s: (-s[1], -s[2], s[0]))
        return [(key, score) for key, score, _ in scores if score >= floor]


def prior_of(history: Sequence[Candidate], campaign_id: str, shape: Sequence[int] | None) -> Prior:
    """The prior for `campaign_id` (timed at `shape` when it has no timing of its own yet)
    from the other campaigns' settled candidates in `history`."""
    contexts: dict[str, Context] = {}
    own = Context(campaign_id)
    for candidate in history:
        cid = candidate.proposal.campaign_id
        if cid == campaign_id:
            own.candidates.append(candidate)
        elif candidate.settled and not (candidate.duplicate or candidate.failed_undelivered):
            contexts.setdefault(cid, Context(cid)).candidates.append(candidate)
    if not contexts:
        return Prior([])
    here_shape = own.shape() or (tuple(shape) if shape else None)
    here_devices = own.devices()
    weighted: list[tuple[float, int, list[Outcome]]] = []
    for order, context in enumerate(contexts.values()):
        weight = shape_similarity(context.shape(), here_shape)
        if here_devices and not (context.devices() & here_devices):
            weight *= OTHER_HOST
        speeds = relative_speeds(context.candidates)
        outcomes = [Outcome(c, speeds.get(c.candidate_id, 0.0), weight) for c in context.candidates]
        weighted.append((weight, order, outcomes))
    weighted.sort(key=lambda w: (w[0], w[1]))
    return Prior([o for _, _, outcomes in weighted for o in outcomes])
