"""Derived dimensions and constraints between dimensions: small integer expressions.

A problem may declare `derived={"half": "cols // 2"}` and `constraints=("cols % 2 == 0",)`.
Expressions use the dim names, integer constants, + - * // % **, comparisons, and / or /
not, and min, max, abs; nothing else (no attributes, no other calls).

Arguments may use derived dims; shapes never give them, and the kernel is not passed them.
A given shape (test, default, campaign, `--shape`) that breaks a rule is refused with
the rule named (`broken`); a drawn shape is moved, one dim at a time by the least step,
until it meets them (`fitted`).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from types import CodeType

import numpy as np

FUNCTIONS = {"min": min, "max": max, "abs": abs}
_NODES = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.Compare,
    ast.BoolOp,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.Call,
    ast.operator,
    ast.unaryop,
    ast.cmpop,
    ast.boolop,
)
NUDGE = 4096
"""How far a drawn dim may be moved (up or down) to meet the constraints."""


class ShapeRuleError(ValueError):
    """A derived dim or constraint that cannot be used; the message is one line."""


@functools.lru_cache(maxsize=512)
def compiled(text: str) -> tuple[CodeType, frozenset[str]]:
    """The expression compiled, with the names it reads (dims; functions excluded)."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ShapeRuleError(f"{text!r} is not an expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _NODES):
            raise ShapeRuleError(f"{text!r}: {type(node).__name__} is not allowed here")
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS and not node.keywords
        ):
            raise ShapeRuleError(f"{text!r}: only min, max and abs may be called")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int):
            raise ShapeRuleError(f"{text!r}: only integer constants are allowed")
    names = frozenset(
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in FUNCTIONS
    )
    return compile(tree, f"<{text}>", "eval"), names


def evaluate(text: str, shape: Mapping[str, int]) -> object:
    code, _ = compiled(text)
    return eval(code, {"__builtins__": {}, **FUNCTIONS}, dict(shape))  # the AST was checked


def check_rules(
    dims: Iterable[str], derived: Mapping[str, str], constraints: Iterable[str]
) -> None:
    """Every derived dim a new name, read only from dims and derived dims before it; every
    constraint over known names."""
    known = set(dims)
    for name, text in derived.items():
        if name in known:
            raise ShapeRuleError(f"derived dim {name!r} is already a dim")
        unknown = sorted(compiled(text)[1] - known)
        if unknown:
            raise ShapeRuleError(f"derived dim {name} = {text} reads unknown dims {unknown}")
        known.add(name)
    for text in constraints:
        unknown = sorted(compiled(text)[1] - known)
        if unknown:
            raise ShapeRuleError(f"constraint {text!r} reads unknown dims {unknown}")


def full_shape(
    dims: Iterable[str], derived: Mapping[str, str], shape: Mapping[str, int]
) -> dict[str, int]:
    """The dims of `shape` with every derived dim computed (a given derived value is
    recomputed). Raises ShapeRuleError when a derived dim is not a positive integer."""
    full = {d: int(shape[d]) for d in dims}
    for name, text in derived.items():
        try:
            value = evaluate(text, full)
        except ArithmeticError as exc:
            raise ShapeRuleError(f"{name} = {text} fails at {full}: {exc}") from None
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise ShapeRuleError(f"{name} = {text} gives {value!r} at {full}, not an integer")
        if value < 1:
            raise ShapeRuleError(f"{name} = {text} gives {value} at {full}; a dim is at least 1")
        full[name] = int(value)
    return full


def broken(
    dims: Iterable[str],
    derived: Mapping[str, str],
    constraints: Iterable[str],
    shape: Mapping[str, int],
) -> list[str]:
    """What `shape` breaks, one line each: a dim missing or below 1, a derived dim that is
    not a positive integer, a constraint that is false (or fails to evaluate)."""
    dims = tuple(dims)
    missing = [d for d in dims if d not in shape]
    if missing:
        return [f"{dict(shape)} lacks dims {missing}"]
    small = [d for d in dims if int(shape[d]) < 1]
    if small:
        return [f"{dict(shape)}: dims {small} are below 1"]
    try:
        full = full_shape(dims, derived, shape)
    except ShapeRuleError as exc:
        return [str(exc)]
    faults = []
    for text in constraints:
        try:
            holds = bool(evaluate(text, full))
        except ArithmeticError:
            holds = False
        if not holds:
            faults.append(f"{_free(full, dims)} breaks the constraint {text}")
    return faults


def fitted(
    dims: Iterable[str],
    derived: Mapping[str, str],
    constraints: Iterable[str],
    shape: Mapping[str, int],
) -> dict[str, int] | None:
    """A drawn shape moved, one dim at a time and as little as possible, until it breaks
    nothing; None when no such move is found."""
    dims, constraints = tuple(dims), tuple(constraints)
    current = {d: int(shape[d]) for d in dims}
    faults = len(broken(dims, derived, constraints, current))
    while faults:
        better = _smallest_move(dims, derived, constraints, current, faults)
        if better is None:
            return None
        current = better
        faults = len(broken(dims, derived, constraints, current))
    return current


def _smallest_move(
    dims: tuple[str, ...],
    derived: Mapping[str, str],
    constraints: tuple[str, ...],
    current: dict[str, int],
    faults: int,
) -> dict[str, int] | None:
    """The shape one dim moved by the least step that breaks fewer rules than `faults`."""
    for step in range(1, NUDGE + 1):
        for d in dims:
            for value in (current[d] + step, current[d] - step):
                moved = {**current, d: value}
                if value >= 1 and len(broken(dims, derived, constraints, moved)) < faults:
                    return moved
    return None


def _free(shape: Mapping[str, int], dims: tuple[str, ...]) -> dict[str, int]:
    return {d: shape[d] for d in dims}
