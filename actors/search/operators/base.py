"""What every source operator shares: checking its parents and parameters, turning the
edits it computes into a child (applied, parsed again, diffed), and the compiler flags a
child needs.

An operator subclasses `SourceOperator` with its `name`, `SPACE` (its first values are the
defaults) and `change()`, which reads the parsed parents and returns a `Change` (edits of
the first parent and the child's flags) or raises `Refuse`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from tree_sitter import Node

from actors.search.operators.c_ast import CSource, Edit, Loop, apply_edits, broken_nodes, parse
from actors.search.operators.protocol import (
    Context,
    Params,
    ParamSpace,
    ParentKernel,
    Refusal,
    Refuse,
    TemplatePoint,
    Variation,
    variation,
)
from gpu_workers.cpu.build import bad_flags
from gpu_workers.targets import target_of
from kernels.design_space import ParamValue

OPENMP = "-fopenmp"
OPENMP_SIMD = "-fopenmp-simd"


@dataclass(frozen=True)
class Job:
    """One application of an operator: its parents parsed and as given, its full point (the
    defaults filled in) and the context."""

    sources: Sequence[CSource]
    parents: Sequence[ParentKernel]
    params: dict[str, ParamValue]
    context: Context

    @property
    def src(self) -> CSource:
        """The first parent, parsed: the one the child is an edit of."""
        return self.sources[0]

    @property
    def flags(self) -> tuple[str, ...]:
        return self.parents[0].flags

    def kernel(self) -> tuple[Node, list[Loop]]:
        """The first parent's kernel function and its for loops, in source order."""
        fn = self.src.kernel()
        return fn, self.src.loops(self.src.body(fn))


@dataclass(frozen=True)
class Change:
    """What an operator does to its first parent: edits of its bytes, the child's flags, and
    the template point the child renders (only a template step's child has one)."""

    edits: tuple[Edit, ...]
    flags: tuple[str, ...]
    point: TemplatePoint | None = None


class SourceOperator:
    """An offline operator on C source (see `protocol.VariationOperator`)."""

    name: ClassVar[str] = ""
    arity: ClassVar[int] = 1
    SPACE: ClassVar[ParamSpace] = {}

    def space(self) -> ParamSpace:
        return dict(self.SPACE)

    def apply(
        self, parents: Sequence[ParentKernel], params: Params, context: Context
    ) -> Variation | Refusal:
        try:
            point = self._point(parents, params, context)
            sources = [CSource(p.source) for p in parents]
            change = self.change(Job(sources, parents, point, context))
        except Refuse as refused:
            return Refusal(self.name, refused.reason, refused.message)
        child = apply_edits(sources[0].data, change.edits).decode()
        if child == parents[0].source and change.flags == parents[0].flags:
            return Refusal(self.name, "no_change", "the child would be its parent")
        broken = broken_nodes(parse(child.encode()))
        if broken:
            return Refusal(self.name, "broken_edit", f"the child does not parse at {broken[0]}")
        refused_flags = bad_flags(change.flags)
        if refused_flags:
            return Refusal(self.name, "bad_flags", f"flags outside the policy: {refused_flags}")
        return variation(self.name, parents, point, child, change.flags, change.point)

    def change(self, job: Job) -> Change:
        """The edits of the first parent and the child's flags, or raise `Refuse`."""
        raise NotImplementedError

    def _point(
        self, parents: Sequence[ParentKernel], params: Params, context: Context
    ) -> dict[str, ParamValue]:
        if target_of(context.target).source_language != "c":
            raise Refuse(
                "wrong_target", f"C source operators serve C targets, not {context.target}"
            )
        if len(parents) != self.arity:
            raise Refuse("arity", f"{self.name} takes {self.arity} parent(s), not {len(parents)}")
        unknown = sorted(set(params) - set(self.SPACE))
        if unknown:
            raise Refuse("bad_param", f"unknown parameters {unknown}")
        point = {name: values[0] for name, values in self.SPACE.items()} | dict(params)
        for name, value in point.items():
            if value not in self.SPACE[name] or type(value) is not type(self.SPACE[name][0]):
                raise Refuse("bad_param", f"{name}={value!r} is not one of {self.SPACE[name]}")
        return point


def with_flags(
    flags: Iterable[str], add: Iterable[str] = (), drop: Iterable[str] = ()
) -> tuple[str, ...]:
    """The flags without `drop`, then with each of `add` not already there."""
    dropped = set(drop)
    kept = [f for f in flags if f not in dropped]
    return tuple(kept + [f for f in dict.fromkeys(add) if f not in kept])


def openmp_flags(flags: Iterable[str], threads: bool) -> tuple[str, ...]:
    """-fopenmp for a kernel that runs threads; else -fopenmp-simd (its `omp simd` counts)
    unless -fopenmp is there already."""
    flags = tuple(flags)
    if threads:
        return with_flags(flags, add=[OPENMP], drop=[OPENMP_SIMD])
    return flags if OPENMP in flags else with_flags(flags, add=[OPENMP_SIMD])
