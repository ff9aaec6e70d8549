"""Lowering a group of ops to a per-row program, shared by the C and CUDA generators.

One group is one kernel. For each row it runs a few loops over the columns:

- a `ReduceLoop` for each row reduction: it computes the elementwise values the
  reduction needs (`lets`) and accumulates the reduction's term;
- a `Scalar` for each per-row value computed from reductions;
- one final `StoreLoop` writing the group's output.

Elementwise values are not stored between loops: a later loop recomputes them from
the group's inputs ("recompute"), or, with reuse="stash", the first reduction loop
writes the value a later loop needs into the output row and the later loop reads it
back from there (one read instead of several, but one extra write).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kernels.design_space import Constraint
from kernels.fusion.ir import (
    MATRIX,
    ROW,
    Call,
    Const,
    Dim,
    Expr,
    Graph,
    Map,
    Ref,
    Step,
    Tensor,
    refs,
)
from kernels.fusion.partitions import partitions

STASH = "@stash"
"""A `Ref` to this name reads the value stashed in the output row."""

REUSE_CHOICES: tuple[str, ...] = ("recompute", "stash")


@dataclass(frozen=True)
class Let:
    name: str
    expr: Expr


@dataclass(frozen=True)
class ReduceLoop:
    acc: str
    lets: tuple[Let, ...]
    term: Expr
    stash: str | None
    """A let whose value is also written to the output row."""


@dataclass(frozen=True)
class Scalar:
    name: str
    expr: Expr


@dataclass(frozen=True)
class StoreLoop:
    lets: tuple[Let, ...]
    value: Expr


RowStatement = ReduceLoop | Scalar | StoreLoop


@dataclass(frozen=True)
class GroupProgram:
    index: int
    ops: tuple[str, ...]
    inputs: tuple[Tensor, ...]
    """Tensors read from outside the group: problem inputs or earlier groups' outputs."""
    output: str
    body: tuple[RowStatement, ...]

    @property
    def stashes(self) -> bool:
        return any(isinstance(s, ReduceLoop) and s.stash for s in self.body)

    @property
    def reductions(self) -> int:
        return sum(isinstance(s, ReduceLoop) for s in self.body)


def _closure(names: list[str], defs: Mapping[str, Expr]) -> list[str]:
    """The deferred elementwise definitions `names` need, dependencies first."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name not in defs or name in order:
            return
        for dep in refs(defs[name]):
            visit(dep)
        order.append(name)

    for name in names:
        visit(name)
    return order


def lower_group(
    graph: Graph, ops: tuple[str, ...], index: int, reuse: str = "recompute"
) -> GroupProgram:
    if reuse not in REUSE_CHOICES:
        raise ValueError(f"reuse must be one of {REUSE_CHOICES}, not {reuse!r}")
    kinds = graph.kinds()
    steps: list[Step] = [s for name in ops for s in graph.op(name).steps]
    defined = {s.out for s in steps}
    external: list[str] = []
    for step in steps:
        for name in refs(step.expr):
            if name not in defined and name not in external:
                external.append(name)
    output = graph.op(ops[-1]).output
    defs: dict[str, Expr] = {}
    body: list[RowStatement] = []
    stashed = False
    for position, step in enumerate(steps):
        if isinstance(step, Map) and step.kind == MATRIX:
            defs[step.out] = step.expr
        elif isinstance(step, Map):
            if any(kinds.get(n) != ROW for n in refs(step.expr)):
                raise ValueError(f"row value {step.out} reads a per-element value")
            body.append(Scalar(step.out, step.expr))
        else:
            needed = _closure(list(refs(step.expr)), defs)
            lets = [Let(n, defs[n]) for n in needed]
            stash: str | None = None
            if reuse == "stash" and not stashed:
                later = {n for s in steps[position + 1 :] for n in refs(s.expr)}
                later |= set(_closure(sorted(later), defs))
                computed = [n for n in needed if n in later and not isinstance(defs[n], Ref)]
                if computed:
                    stash = computed[-1]
            body.append(ReduceLoop(step.out, tuple(lets), step.expr, stash))
            if stash is not None:
                defs[stash] = Ref(STASH)
                stashed = True
    final = _closure([output], defs)
    body.append(StoreLoop(tuple(Let(n, defs[n]) for n in final[:-1]), defs[output]))
    inputs = tuple(Tensor(n, kinds[n]) for n in external)
    return GroupProgram(index, ops, inputs, output, tuple(body))


def lower(
    graph: Graph, groups: tuple[tuple[str, ...], ...], reuse: str = "recompute"
) -> tuple[GroupProgram, ...]:
    return tuple(lower_group(graph, g, i, reuse) for i, g in enumerate(groups))


def stash_applies(graph: Graph, groups: tuple[tuple[str, ...], ...]) -> bool:
    """Whether reuse="stash" changes anything: some group computes a value a reduction
    reads and a later loop reads again."""
    return any(p.stashes for p in lower(graph, groups, "stash"))


def stash_constraint(graph: Graph) -> Constraint:
    """The constraint every target's fusion space puts on `reuse`: stash only in the
    partitions where it applies."""
    stashable = frozenset(
        p.key for p in partitions(graph.op_names) if stash_applies(graph, p.groups)
    )
    constraint = Constraint(
        "stash only where a reduction reads a computed value",
        "reuse=stash changes nothing unless some group computes a value that a row "
        "reduction reads and a later loop reads again",
        lambda p: p["reuse"] != "stash" or str(p["partition"]) in stashable,
    )
    return constraint


# expressions as C text (CUDA C is the same language for these) -------------------------


FUNCTION_TEXT: dict[str, Callable[[list[str]], str]] = {
    "add": lambda a: f"({a[0]} + {a[1]})",
    "sub": lambda a: f"({a[0]} - {a[1]})",
    "mul": lambda a: f"({a[0]} * {a[1]})",
    "div": lambda a: f"({a[0]} / {a[1]})",
    "rsqrt": lambda a: f"kf_rsqrt({a[0]})",
    "gelu_tanh": lambda a: f"kf_gelu({a[0]})",
}


def float_literal(value: float) -> str:
    text = repr(float(value))
    if "e" not in text and "." not in text and "inf" not in text and "nan" not in text:
        text += ".0"
    return f"{text}f"


def c_expr(expr: Expr, name: Callable[[str], str], dims: Mapping[str, str]) -> str:
    """C text of an expression; `name` spells a referenced value, `dims` a dimension."""
    if isinstance(expr, Ref):
        return name(expr.name)
    if isinstance(expr, Dim):
        return f"(float){dims[expr.name]}"
    if isinstance(expr, Const):
        return float_literal(expr.value)
    assert isinstance(expr, Call)
    return FUNCTION_TEXT[expr.fn]([c_expr(a, name, dims) for a in expr.args])


def value_name(name: str) -> str:
    """The C identifier of a step value or per-row scalar."""
    return "v_" + "".join(ch if ch.isalnum() else "_" for ch in name)


def tensor_param(name: str) -> str:
    return "t_" + "".join(ch if ch.isalnum() else "_" for ch in name)
