"""The C helpers an operator puts into a child, rendered from the project's cpu templates,
never written ad hoc: the maths of `kernels/cpu_templates/_approx_math.c.j2` (`kf_exp_full`,
`kf_log_medium`, ... one per function and accuracy level) and `kf_stream_row` of
`_stream_row.c.j2` (the fused kernels' non-temporal row store).

Each is inserted once, before the first function of the file that is not a helper (with
the comment right above it), after the helpers it calls. A helper's name says what it is,
so a child that already defines it (an earlier operator put it there) keeps it; a function
of that name with other text is refused (`name_taken`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tree_sitter import Node

from actors.search.operators.c_ast import CSource, Edit, declarator_name, parse
from actors.search.operators.protocol import Refuse
from kernels.design_space import render_file

PREFIX = "kf_"
LEVELS = ("full", "medium", "low")
"""Accuracy levels: full is within a few ulps of libm; medium and low drop polynomial terms
or Newton steps (see `_MATH` for what each level is, per function)."""
STREAM_ROW = "kf_stream_row"

_MATH: dict[str, dict[str, dict[str, Any]]] = {
    "exp": {"full": {"terms": 6}, "medium": {"terms": 4}, "low": {"terms": 3}},
    "log": {"full": {"terms": 9}, "medium": {"terms": 7}, "low": {"terms": 5}},
    "tanh": {"full": {"terms": 5}, "medium": {"terms": 4}, "low": {"terms": 3}},
    "erf": {
        "full": {"terms": 6, "fine": True},
        "medium": {"terms": 5, "fine": True},
        "low": {"terms": 4, "fine": False},
    },
    "log1p": {level: {} for level in LEVELS},
    "rsqrt": {"full": {"steps": 3}, "medium": {"steps": 2}, "low": {"steps": 1}},
    "sqrt": {level: {} for level in LEVELS},
}
"""Per function and level, the template's accuracy parameters."""
ERROR_BOUND: dict[str, tuple[float, float, float]] = {
    "exp": (2.4e-7, 7.1e-5, 6.5e-4),
    "log": (1.0e-7, 4.0e-5, 2.5e-4),
    "log1p": (2.0e-7, 4.0e-5, 2.5e-4),
    "tanh": (1.5e-7, 6.0e-5, 5.0e-4),
    "erf": (6.0e-7, 2.7e-6, 4.0e-5),
    "rsqrt": (2.0e-7, 5.0e-6, 1.8e-3),
    "sqrt": (2.0e-7, 5.0e-6, 1.8e-3),
}
"""Per function, the largest relative error of its full, medium and low levels over the
float range (measured: tests/test_approx_math_accuracy.py holds each level under its
bound)."""
_CALLS = {"tanh": "exp", "erf": "exp", "log1p": "log", "sqrt": "rsqrt"}
"""The helper each one calls, at the same level."""


def error_bound(helper: str, level: str) -> float:
    """The error bound of a helper (`kf_exp_full`) or function kind (`exp`) at `level`."""
    kind = helper.removeprefix(PREFIX).removesuffix(f"_{level}")
    return ERROR_BOUND[kind][LEVELS.index(level)]


def math_name(kind: str, level: str) -> str:
    return f"{PREFIX}{kind}_{level}"


def _math_entry(name: str) -> dict[str, Any] | None:
    kind, _, level = name.removeprefix(PREFIX).rpartition("_")
    if kind not in _MATH or level not in LEVELS:
        return None
    entry: dict[str, Any] = {"kind": kind, "name": name, **_MATH[kind][level]}
    if kind in _CALLS:
        entry[_CALLS[kind]] = math_name(_CALLS[kind], level)
    return entry


def is_helper(name: str) -> bool:
    return name == STREAM_ROW or _math_entry(name) is not None


def _with_callees(names: Iterable[str]) -> list[str]:
    """The helpers, each after the one it calls, without repeats."""
    ordered: list[str] = []
    for name in names:
        entry = _math_entry(name)
        callee = None if entry is None else _CALLS.get(entry["kind"])
        if entry is not None and callee is not None:
            ordered += [n for n in _with_callees([entry[callee]]) if n not in ordered]
        if name not in ordered:
            ordered.append(name)
    return ordered


def render(name: str) -> str:
    """One helper's C text (its comment and definition), from its template."""
    if name == STREAM_ROW:
        return render_file("cpu", "_stream_row.c.j2")
    entry = _math_entry(name)
    if entry is None:
        raise ValueError(f"{name} is not a helper of the cpu templates")
    return render_file("cpu", "_approx_math.c.j2", helpers=[entry])


def _definition(text: str, name: str) -> str:
    for node in parse(text.encode()).children:
        declared = declarator_name(node.child_by_field_name("declarator"))
        if node.type == "function_definition" and declared == name:
            return (node.text or b"").decode()
    raise ValueError(f"the template's text defines no {name}")


def definition_start(src: CSource, fn: Node) -> int:
    """Where a top-level definition begins, the comments right above it included."""
    start = fn.start_byte
    prev = fn.prev_sibling
    while prev is not None and prev.type == "comment":
        gap = src.data[prev.end_byte : start]
        if gap.count(b"\n") > 1 or gap.strip():
            break
        start = prev.start_byte
        prev = prev.prev_sibling
    return src.line_start(start)


def insert_helpers(src: CSource, names: Iterable[str]) -> list[Edit]:
    """Edits that define the helpers (and those they call) the source lacks."""
    defined = src.functions()
    missing: list[str] = []
    for name in _with_callees(names):
        if name not in defined:
            missing.append(name)
        elif src.text(defined[name]) != _definition(render(name), name):
            raise Refuse("name_taken", f"the source defines its own {name}")
    if not missing:
        return []
    first = next((fn for n, fn in defined.items() if not is_helper(n)), None)
    if first is None:
        raise Refuse("no_kernel", "the source defines no function to put helpers before")
    at = definition_start(src, first)
    return [Edit(at, at, "".join(render(n).rstrip("\n") + "\n\n" for n in missing))]
