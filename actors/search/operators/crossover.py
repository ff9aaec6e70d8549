"""Crossover of two parents, at the granularity of loops or functions.

The child is the first parent with one unit taken from the second:
- unit "loop": a loop (with its pragmas) where both parents have one at the same place in
  their kernels' loop nests (the same path of loop indexes from the kernel's body down) with
  the same counter and range, and the two differ; `index` counts those loops in source order.
- unit "function": a function both define, with different text (the kernel included).
Helpers the taken unit calls and the first parent lacks come with it: the template helpers
are rendered again (`helpers.py`), the second parent's own functions copied. A taken loop
may use only names the first parent declares in the kernel outside that loop (else
unbound_name). The child's flags are the first parent's, plus those of the second it does
not have (-fopenmp replacing -fopenmp-simd), the first's optimisation level kept.

Parameters: unit ("loop", "function"), index (0-3). Refusals: parents_identical,
no_such_unit (fewer differing units than index + 1), unbound_name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from tree_sitter import Node

from actors.search.operators.base import (
    OPENMP,
    OPENMP_SIMD,
    Change,
    Job,
    SourceOperator,
    with_flags,
)
from actors.search.operators.c_ast import CSource, Edit, Loop, named_descendants, walk
from actors.search.operators.helpers import definition_start, insert_helpers, is_helper
from actors.search.operators.protocol import ParamSpace, Refuse


def _path(loop: Loop, loops: Sequence[Loop]) -> tuple[int, ...]:
    """Where a loop stands in its nest: its index among its siblings at each level."""
    siblings = [lp for lp in loops if lp.parent is loop.parent]
    own = (siblings.index(loop),)
    return own if loop.parent is None else (*_path(loop.parent, loops), *own)


def _header(src: CSource, loop: Loop) -> tuple[str | None, ...]:
    parts = (loop.start, loop.bound)
    return (loop.var, loop.op, str(loop.step), *(None if p is None else src.text(p) for p in parts))


def _unit_text(src: CSource, node: Node) -> str:
    return src.data[src.lines_start(node) : node.end_byte].decode()


def merged_flags(first: Sequence[str], second: Sequence[str]) -> tuple[str, ...]:
    extra = [f for f in second if not f.startswith("-O") and f not in first]
    flags = with_flags(first, add=extra)
    return with_flags(flags, drop=[OPENMP_SIMD]) if OPENMP in flags else flags


class Crossover(SourceOperator):
    name = "crossover"
    arity = 2
    SPACE: ClassVar[ParamSpace] = {"unit": ("loop", "function"), "index": (0, 1, 2, 3)}

    def change(self, job: Job) -> Change:
        a, b = job.sources
        params = job.params
        if a.source == b.source:
            raise Refuse("parents_identical", "the two parents have the same source")
        index = int(params["index"])
        units = self._loops(a, b) if params["unit"] == "loop" else self._functions(a, b)
        if index >= len(units):
            raise Refuse(
                "no_such_unit",
                f"the parents differ in {len(units)} {params['unit']}(s), not {index + 1}",
            )
        mine, theirs = units[index]
        if params["unit"] == "loop":
            self._check_names(a, b, mine, theirs)
            span = (a.lines_start(mine), b.lines_start(theirs))
        else:
            span = (definition_start(a, mine), definition_start(b, theirs))
        edits = [Edit(span[0], mine.end_byte, b.data[span[1] : theirs.end_byte].decode())]
        edits += self._callees(a, b, theirs)
        for include in (n for n in b.root.children if n.type == "preproc_include"):
            edits += a.include(b.text(include).strip())
        return Change(tuple(edits), merged_flags(job.flags, job.parents[1].flags))

    def _loops(self, a: CSource, b: CSource) -> list[tuple[Node, Node]]:
        la, lb = a.loops(a.body(a.kernel())), b.loops(b.body(b.kernel()))
        by_place = {(_path(lp, lb), _header(b, lp)): lp for lp in lb}
        units: list[tuple[Node, Node]] = []
        for lp in la:
            other = by_place.get((_path(lp, la), _header(a, lp)))
            if other is not None and _unit_text(a, lp.node) != _unit_text(b, other.node):
                units.append((lp.node, other.node))
        return units

    def _functions(self, a: CSource, b: CSource) -> list[tuple[Node, Node]]:
        theirs = b.functions()
        return [
            (fn, theirs[name])
            for name, fn in a.functions().items()
            if name in theirs and not is_helper(name) and a.text(fn) != b.text(theirs[name])
        ]

    def _check_names(self, a: CSource, b: CSource, mine: Node, theirs: Node) -> None:
        """Every name the taken loop uses but does not declare, that the second parent's
        kernel declares outside it, must be declared in the first's outside the replaced one."""

        def outside(src: CSource, loop: Node) -> set[str]:
            fn = src.kernel()
            names = {p.name for p in src.params(fn)}
            for decl in named_descendants(src.body(fn), "declaration"):
                if not (loop.start_byte <= decl.start_byte < loop.end_byte):
                    names |= src.declared_names(decl) | {
                        src.text(n)
                        for n in decl.children_by_field_name("declarator")
                        if n.type == "identifier"
                    }
            return names

        used = {b.text(n) for n in walk(theirs) if n.type == "identifier"} - b.declared_names(
            theirs
        )
        missing = sorted((used & outside(b, theirs)) - outside(a, mine))
        if missing:
            raise Refuse(
                "unbound_name",
                f"the taken loop uses {', '.join(missing)}, which the first parent lacks",
            )

    def _callees(self, a: CSource, b: CSource, theirs: Node) -> list[Edit]:
        """The functions the taken unit calls (and those they call) that only the second
        parent defines: template helpers rendered again, the others copied."""
        defined_a, defined_b = a.functions(), b.functions()
        wanted: list[str] = []
        pending = [theirs]
        while pending:
            for call in named_descendants(pending.pop(), "call_expression"):
                name = b.text(call.child_by_field_name("function") or call)
                if name in defined_b and name not in defined_a and name not in wanted:
                    wanted.append(name)
                    pending.append(defined_b[name])
        edits = insert_helpers(a, [n for n in wanted if is_helper(n)])
        own = [n for n in wanted if not is_helper(n)]
        if own:
            first = next(fn for n, fn in defined_a.items() if not is_helper(n))
            at = definition_start(a, first)
            text = "".join(
                b.data[definition_start(b, defined_b[n]) : defined_b[n].end_byte].decode() + "\n\n"
                for n in own
            )
            edits.append(Edit(at, at, text))
        return edits
