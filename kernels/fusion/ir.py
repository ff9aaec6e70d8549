"""A small op IR for graph problems: chains of elementwise ops and row reductions.

Tensors are row-major. Each has a kind: `MATRIX` [rows, cols], `COLUMN` [cols] (a
per-column vector such as a norm weight, broadcast over rows) or `ROW` [rows] (a
per-row scalar, such as the mean of squares a norm divides by).

An `Op` is one named node of `Problem.graph` (for example "rmsnorm"). It consumes the
value flowing down the chain plus side inputs, produces one MATRIX value, and is made
of primitive steps:

- `Map`: an elementwise expression; a MATRIX map is evaluated per element, a ROW map
  once per row (it may only read ROW values and dimensions);
- `RowReduce`: the sum over a row of an elementwise expression, giving a ROW value.

A fusion partition groups whole ops; the steps inside one op always stay together.
Code generators (`codegen_c`, `codegen_cuda`) and the numpy interpreter `evaluate`
read the same IR, so the fused kernels and the unfused chain compute the same thing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.builtin import GELU_C, RMSNORM_EPS
from kernels.spec import Array, Arrays, Problem

MATRIX = "matrix"
COLUMN = "column"
ROW = "row"
KINDS = (MATRIX, COLUMN, ROW)


class NotAGraphProblem(ValueError):
    """The problem has no chain of ops, or uses an op or an argument layout the IR lacks."""


# expressions --------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """A tensor (or step value) by name."""

    name: str


@dataclass(frozen=True)
class Dim:
    """The size of a dimension as a float: "cols" is the length of a row."""

    name: str


@dataclass(frozen=True)
class Const:
    value: float


@dataclass(frozen=True)
class Call:
    """`fn` applied to `args`; `fn` is one of FUNCTIONS."""

    fn: str
    args: tuple[Expr, ...]


Expr = Ref | Dim | Const | Call

FUNCTIONS: dict[str, int] = {
    "add": 2,
    "sub": 2,
    "mul": 2,
    "div": 2,
    "rsqrt": 1,
    "gelu_tanh": 1,
}
"""Every function an expression may call, with its arity. Code generators cover all of them."""


def add(a: Expr, b: Expr) -> Call:
    return Call("add", (a, b))


def mul(a: Expr, b: Expr) -> Call:
    return Call("mul", (a, b))


def div(a: Expr, b: Expr) -> Call:
    return Call("div", (a, b))


def refs(expr: Expr) -> Iterator[str]:
    """Names referenced by an expression, depth first, with repeats."""
    if isinstance(expr, Ref):
        yield expr.name
    elif isinstance(expr, Call):
        for arg in expr.args:
            yield from refs(arg)


# steps, ops, graphs -------------------------------------------------------------------


@dataclass(frozen=True)
class Map:
    out: str
    kind: str
    expr: Expr


@dataclass(frozen=True)
class RowReduce:
    """out[i] = sum over j of expr evaluated at (i, j)."""

    out: str
    expr: Expr


Step = Map | RowReduce


@dataclass(frozen=True)
class Tensor:
    name: str
    kind: str


@dataclass(frozen=True)
class Op:
    name: str
    inputs: tuple[str, ...]
    """Tensors it reads from outside: the flowing value first, then side inputs."""
    output: str
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Graph:
    """A chain of ops over the problem's arguments; ops run in order."""

    problem: str
    row_dim: str
    col_dim: str
    inputs: tuple[Tensor, ...]
    output: str
    ops: tuple[Op, ...]

    @property
    def op_names(self) -> tuple[str, ...]:
        return tuple(op.name for op in self.ops)

    def op(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(name)

    def kinds(self) -> dict[str, str]:
        """The kind of every tensor and step value in the graph."""
        kinds = {t.name: t.kind for t in self.inputs}
        for op in self.ops:
            for step in op.steps:
                kinds[step.out] = step.kind if isinstance(step, Map) else ROW
            kinds[op.output] = MATRIX
        return kinds


# the op library -----------------------------------------------------------------------


@dataclass(frozen=True)
class OpDef:
    """How to build one named op of a chain: the kinds of its side inputs, and its steps."""

    name: str
    side_kinds: tuple[str, ...]
    doc: str
    build: Callable[[str, tuple[str, ...], str], tuple[Step, ...]]
    """(flowing input, side inputs, output name) -> steps; step values are prefixed by the op."""


def _add_steps(flow: str, sides: tuple[str, ...], out: str) -> tuple[Step, ...]:
    return (Map(out, MATRIX, add(Ref(flow), Ref(sides[0]))),)


def _rmsnorm_steps(flow: str, sides: tuple[str, ...], out: str) -> tuple[Step, ...]:
    ss, inv = "rmsnorm_ss", "rmsnorm_inv"
    return (
        RowReduce(ss, mul(Ref(flow), Ref(flow))),
        Map(inv, ROW, Call("rsqrt", (add(div(Ref(ss), Dim("cols")), Const(RMSNORM_EPS)),))),
        Map(out, MATRIX, mul(mul(Ref(flow), Ref(inv)), Ref(sides[0]))),
    )


def _gelu_steps(flow: str, sides: tuple[str, ...], out: str) -> tuple[Step, ...]:
    return (Map(out, MATRIX, Call("gelu_tanh", (Ref(flow),))),)


OP_LIBRARY: dict[str, OpDef] = {
    d.name: d
    for d in (
        OpDef("add", (MATRIX,), "residual add: h = x + r", _add_steps),
        OpDef(
            "rmsnorm",
            (COLUMN,),
            f"u = h / sqrt(mean_j(h^2) + {RMSNORM_EPS}) * w[j]",
            _rmsnorm_steps,
        ),
        OpDef(
            "gelu",
            (),
            "y = gelu_tanh(u) = 0.5 u (1 + tanh(sqrt(2/pi)(u + 0.044715 u^3)))",
            _gelu_steps,
        ),
    )
}
"""The ops a chain may name in `Problem.graph`."""


def _kind_of(dims: tuple[str, ...], row_dim: str, col_dim: str) -> str | None:
    if dims == (row_dim, col_dim):
        return MATRIX
    if dims == (col_dim,):
        return COLUMN
    if dims == (row_dim,):
        return ROW
    return None


def graph_of(problem: Problem) -> Graph:
    """The IR of a graph problem, derived from `Problem.graph` and its arguments.

    The chain starts from the first MATRIX input; each op takes its side inputs from the
    problem's unused inputs of the right kind, in argument order; the last op writes the
    problem's single output. Every input must be consumed."""
    if not problem.graph:
        raise NotAGraphProblem(f"{problem.name} has no graph (Problem.graph is empty)")
    if len(problem.dims) != 2:
        raise NotAGraphProblem(f"{problem.name}: graph problems are [rows, cols]")
    if len(set(problem.graph)) != len(problem.graph):
        raise NotAGraphProblem(f"{problem.name}: op names in the chain must be unique")
    row_dim, col_dim = problem.dims
    inputs: list[Tensor] = []
    for arg in problem.inputs:
        kind = _kind_of(arg.dims, row_dim, col_dim)
        if kind is None:
            raise NotAGraphProblem(f"{problem.name}: input {arg.name} has dims {arg.dims}")
        inputs.append(Tensor(arg.name, kind))
    outputs = problem.outputs
    if len(outputs) != 1 or _kind_of(outputs[0].dims, row_dim, col_dim) != MATRIX:
        raise NotAGraphProblem(f"{problem.name}: a chain writes one [rows, cols] output")
    unused = list(inputs)
    first = next((t for t in unused if t.kind == MATRIX), None)
    if first is None:
        raise NotAGraphProblem(f"{problem.name}: no [rows, cols] input to start the chain")
    unused.remove(first)
    flow = first.name
    ops: list[Op] = []
    for index, name in enumerate(problem.graph):
        definition = OP_LIBRARY.get(name)
        if definition is None:
            raise NotAGraphProblem(
                f"{problem.name}: unknown op {name!r}; known: {', '.join(sorted(OP_LIBRARY))}"
            )
        sides: list[str] = []
        for kind in definition.side_kinds:
            match = next((t for t in unused if t.kind == kind), None)
            if match is None:
                raise NotAGraphProblem(f"{problem.name}: op {name} needs another {kind} input")
            unused.remove(match)
            sides.append(match.name)
        last = index == len(problem.graph) - 1
        out = outputs[0].name if last else f"{name}_out"
        steps = definition.build(flow, tuple(sides), out)
        ops.append(Op(name, (flow, *sides), out, steps))
        flow = out
    if unused:
        raise NotAGraphProblem(
            f"{problem.name}: inputs {', '.join(t.name for t in unused)} are used by no op"
        )
    return Graph(problem.name, row_dim, col_dim, tuple(inputs), outputs[0].name, tuple(ops))


# the numpy interpreter: the unfused chain ---------------------------------------------


def _apply(fn: str, args: list[Array], dtype: Any) -> Array:
    if fn == "add":
        return args[0] + args[1]
    if fn == "sub":
        return args[0] - args[1]
    if fn == "mul":
        return args[0] * args[1]
    if fn == "div":
        return args[0] / args[1]
    if fn == "rsqrt":
        return dtype.type(1.0) / np.sqrt(args[0])
    if fn == "gelu_tanh":
        x = args[0]
        c, k = dtype.type(GELU_C), dtype.type(0.044715)
        return dtype.type(0.5) * x * (1 + np.tanh(c * (x + k * x * x * x)))
    raise ValueError(f"unknown function {fn!r}")


def _eval(expr: Expr, env: Mapping[str, Array], dims: Mapping[str, int], dtype: Any) -> Array:
    if isinstance(expr, Ref):
        return env[expr.name]
    if isinstance(expr, Dim):
        return np.asarray(dims[expr.name], dtype=dtype)
    if isinstance(expr, Const):
        return np.asarray(expr.value, dtype=dtype)
    return _apply(expr.fn, [_eval(a, env, dims, dtype) for a in expr.args], dtype)


def evaluate(graph: Graph, inputs: Arrays) -> Arrays:
    """Run the chain op by op with numpy in the inputs' dtype: the unfused per-op sequence,
    every intermediate a full array. Returns the graph's output by name."""
    first = inputs[graph.inputs[0].name]
    dtype = first.dtype
    rows, cols = first.shape
    dims = {"rows": rows, "cols": cols, graph.row_dim: rows, graph.col_dim: cols}
    env: dict[str, Array] = {}
    for t in graph.inputs:
        value = inputs[t.name]
        env[t.name] = value[:, None] if t.kind == ROW else value
    for op in graph.ops:
        for step in op.steps:
            if isinstance(step, RowReduce):
                term = np.broadcast_to(_eval(step.expr, env, dims, dtype), (rows, cols))
                env[step.out] = term.sum(axis=1, keepdims=True, dtype=dtype)
            else:
                env[step.out] = _eval(step.expr, env, dims, dtype)
    return {graph.output: np.ascontiguousarray(env[graph.output], dtype=dtype)}


def unfused_chain(problem: Problem) -> Callable[[Arrays], Arrays]:
    """The unfused numpy chain of a graph problem, built from its IR."""
    graph = graph_of(problem)
    return lambda inputs: evaluate(graph, inputs)
