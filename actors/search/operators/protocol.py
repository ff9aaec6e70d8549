"""What a variation operator is: the `VariationOperator` protocol and the plain data it takes
and gives.

An operator takes one parent kernel (two for a crossover), a point of its parameter space
and the context of the campaign, and gives either a `Variation` (the child's source and
flags, what made it, and a unified diff against the first parent) or a `Refusal` (a stable
reason code and a one-line message) where its precondition does not hold. It never runs
anything: the verifier judges every child, so an operator may propose something wrong, and
the verifier must reject it.

A child is a parent of the next generation (`Variation.as_parent`), so operators compose:
omp parallel, then simd, then fast exp, ... Each parent carries its lineage (the steps that
made it from its root) and the evidence on it (the verdict, its worst element, timings, the
roofline fraction); the context carries the lessons for the problem and target. The offline
operators decide from the source alone and carry those for the planner (and for operators
that read them: an LLM's improve or fix). Every parameter space is a dict of name -> values,
like the template spaces, so optuna or a bandit searches it; each parameter's first value
is its default. The same inputs give the same child, byte for byte.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kernels.design_space import ParamValue

ParamSpace = dict[str, tuple[ParamValue, ...]]
"""An operator's parameters and the values each may take (the first is the default)."""
Params = Mapping[str, ParamValue]


@dataclass(frozen=True)
class Evidence:
    """What is known of a parent: its verdict (None: not judged yet), the rejection's reason
    code, the worst element as the verdict describes it, its median time and its fraction
    of the roofline bound."""

    verified: bool | None = None
    rejection: str = ""
    worst: str = ""
    median_ns: float | None = None
    roofline_fraction: float | None = None


@dataclass(frozen=True)
class Step:
    """One application of an operator in a kernel's lineage."""

    operator: str
    params: tuple[tuple[str, ParamValue], ...]
    parents: tuple[str, ...]


TemplatePoint = tuple[str, tuple[tuple[str, ParamValue], ...]]
"""A template's name and a point of its space (its items in name order)."""


@dataclass(frozen=True)
class ParentKernel:
    """A kernel an operator varies: the candidate's id, its C source and compiler flags, the
    steps that made it from its root (earliest first), the evidence on it, and the template
    point it is a rendering of (None: its source is no template's rendering)."""

    candidate_id: str
    source: str
    flags: tuple[str, ...]
    lineage: tuple[Step, ...] = ()
    evidence: Evidence | None = None
    point: TemplatePoint | None = None


@dataclass(frozen=True)
class Context:
    """The campaign around an application: its problem and target, the lessons learned for
    them, the problem's relative tolerance (None: unknown) for operators that trade
    accuracy for speed, and the element type."""

    problem: str = ""
    target: str = "cpu"
    lessons: tuple[str, ...] = ()
    rtol: float | None = None
    dtype: str = "fp32"


@dataclass(frozen=True)
class Variation:
    """A child: its source and flags, the operator and point that made it, its parents' ids
    and a unified diff of its source against the first parent's."""

    operator: str
    params: dict[str, ParamValue]
    parents: tuple[str, ...]
    source: str
    flags: tuple[str, ...]
    diff: str
    lineage: tuple[Step, ...] = field(default=())
    """The first parent's lineage and this step."""
    point: TemplatePoint | None = None
    """The template point the child renders, if it is one (`template`'s children)."""

    def as_parent(self, candidate_id: str, evidence: Evidence | None = None) -> ParentKernel:
        """The child as a parent of the next generation, once it has a candidate id."""
        return ParentKernel(
            candidate_id, self.source, self.flags, self.lineage, evidence, self.point
        )


@dataclass(frozen=True)
class Refusal:
    """Why an operator gives no child: a stable reason code and a one-line message."""

    operator: str
    reason: str
    message: str


class Refuse(Exception):
    """Raised inside an operator (and the analyses it calls) where its precondition fails;
    the operator answers with the `Refusal` it describes."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class Searched(Protocol):
    """What the planner knows of an operator: `name` (the registry's key), `arity` (how
    many parents it takes) and `space()`."""

    @property
    def name(self) -> str: ...

    @property
    def arity(self) -> int: ...

    def space(self) -> ParamSpace: ...


class VariationOperator(Searched, Protocol):
    """An operator of the search: `Searched`, and `apply()`."""

    def apply(
        self, parents: Sequence[ParentKernel], params: Params, context: Context
    ) -> Variation | Refusal: ...


class AsyncVariationOperator(Searched, Protocol):
    """An operator that needs I/O to vary its parents (an LLM, the compiler, the sandbox):
    `VariationOperator` with an awaitable `apply`. The planner sees only what it is
    `Searched` by; the kernel writer awaits it."""

    async def apply(
        self, parents: Sequence[ParentKernel], params: Params, context: Context
    ) -> Variation | Refusal: ...


def unified_diff(parent: ParentKernel, child: str, operator: str) -> str:
    """The child's source against the parent's, as `diff -u` writes it."""
    return "".join(
        difflib.unified_diff(
            parent.source.splitlines(keepends=True),
            child.splitlines(keepends=True),
            fromfile=f"{parent.candidate_id}.c",
            tofile=f"{operator}.c",
        )
    )


def variation(
    operator: str,
    parents: Sequence[ParentKernel],
    params: Params,
    source: str,
    flags: tuple[str, ...],
    rendered: TemplatePoint | None = None,
) -> Variation:
    ids = tuple(p.candidate_id for p in parents)
    point = dict(params)
    step = Step(operator, tuple(sorted(point.items())), ids)
    return Variation(
        operator=operator,
        params=point,
        parents=ids,
        source=source,
        flags=flags,
        diff=unified_diff(parents[0], source, operator),
        lineage=(*parents[0].lineage, step),
        point=rendered,
    )
