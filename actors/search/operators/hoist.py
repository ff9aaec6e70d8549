"""Hoist loop-invariant divisions and loads out of the loops that repeat them.

A floating-point division whose divisor does not change in its innermost loop (`x / s`,
`y[i] /= s`, `(x - mean) / sqrtf(var + eps)`) becomes a multiplication by a reciprocal
computed once before the loop (`const float kf_inv_0 = 1.0f / (s);`); a load whose array
the loop does not write and whose index does not change in it (`w[0]`, `b[r]`) is read
once before the loop, guarded so that a loop that runs no iteration reads nothing. Integer
divisions, and anything under a condition inside the loop, stay as they are.

A reciprocal costs up to 1.5 ulps more than the division: where the problem's relative
tolerance (the context's rtol) is known and below `MIN_RTOL`, divisions are refused
(tolerance_too_tight); the verifier judges the rest.

Parameters: what ("both", "divisions", "loads").
Refusals: nothing_invariant, tolerance_too_tight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from tree_sitter import Node

from actors.search.operators.base import Change, Job, SourceOperator
from actors.search.operators.c_ast import (
    FLOAT_TYPES,
    Edit,
    Loop,
    ancestors,
    enclosing_loops,
    inside,
    is_float_literal,
    walk,
)
from actors.search.operators.dependence import (
    PURE_CALLS,
    Alias,
    aliases,
    assigned_names,
    body_of,
)
from actors.search.operators.protocol import ParamSpace, Refuse

MIN_RTOL = 16 * 2.0**-24
"""The smallest relative tolerance a reciprocal is proposed under (16 half-ulps of fp32)."""
_CONDITIONAL = frozenset({"if_statement", "conditional_expression", "switch_statement"})


@dataclass
class _Hoisted:
    """What one loop gets before it: declarations, by the expression they hold."""

    names: dict[str, str] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


class Hoist(SourceOperator):
    name = "hoist"
    SPACE: ClassVar[ParamSpace] = {"what": ("both", "divisions", "loads")}

    def change(self, job: Job) -> Change:
        src, params = job.src, job.params
        fn = src.kernel()
        self.src, self.types = src, src.declared_types(fn)
        self.known = aliases(src, fn)
        loops = src.loops(src.body(fn))
        taken = sum(1 for n in self.types if n.startswith(("kf_inv_", "kf_ld_")))
        self.count = taken
        self.hoisted: dict[int, tuple[Loop, _Hoisted]] = {}
        edits: list[Edit] = []
        covered: list[Node] = []
        if params["what"] in ("both", "divisions"):
            edits += self._divisions(src.body(fn), loops, covered)
            rtol = job.context.rtol
            if edits and rtol is not None and rtol < MIN_RTOL:
                raise Refuse(
                    "tolerance_too_tight",
                    f"rtol {rtol:g} leaves no room for a reciprocal (needs {MIN_RTOL:.2g})",
                )
        if params["what"] in ("both", "loads"):
            edits += self._loads(src.body(fn), loops, covered)
        if not edits:
            raise Refuse("nothing_invariant", "no loop repeats an invariant division or load")
        for loop, hoisted in self.hoisted.values():
            edits += src.insert_lines_before(loop.node, hoisted.lines)
        return Change(tuple(edits), job.flags)

    def _declare(self, loop: Loop, kind: str, expression: str, line: str) -> str:
        _, hoisted = self.hoisted.setdefault(loop.node.id, (loop, _Hoisted()))
        if expression not in hoisted.names:
            name = f"kf_{kind}_{self.count}"
            self.count += 1
            hoisted.names[expression] = name
            hoisted.lines.append(line.replace("@", name))
        return hoisted.names[expression]

    def _divisions(self, body: Node, loops: list[Loop], covered: list[Node]) -> list[Edit]:
        src = self.src
        edits: list[Edit] = []
        for node in walk(body):
            operator = node.child_by_field_name("operator")
            op = "" if operator is None else src.text(operator)
            if operator is None or (node.type, op) not in (
                ("binary_expression", "/"),
                ("assignment_expression", "/="),
            ):
                continue
            left, divisor = node.child_by_field_name("left"), node.child_by_field_name("right")
            assert left is not None and divisor is not None
            loop = self._loop_of(node, loops)
            if loop is None or not self._float(node) or src.is_one(left):
                continue
            if not self._invariant(divisor, loop):
                continue
            kind = "double" if self._double(node) else "float"
            one = "1.0" if kind == "double" else "1.0f"
            text = src.text(divisor)
            simple = divisor.type in ("identifier", "number_literal", "call_expression")
            operand = text if simple or divisor.type == "parenthesized_expression" else f"({text})"
            name = self._declare(loop, "inv", text, f"const {kind} @ = {one} / {operand};")
            edits += [
                Edit(operator.start_byte, operator.end_byte, "*=" if op == "/=" else "*"),
                Edit(divisor.start_byte, divisor.end_byte, name),
            ]
            covered.append(divisor)
        return edits

    def _loads(self, body: Node, loops: list[Loop], covered: list[Node]) -> list[Edit]:
        src = self.src
        edits: list[Edit] = []
        for node in walk(body):
            if node.type != "subscript_expression" or any(inside(node, c) for c in covered):
                continue
            loop = self._loop_of(node, loops)
            array = node.child_by_field_name("argument")
            if loop is None or array is None or array.type != "identifier":
                continue
            parent = node.parent
            if parent is not None and (
                parent.type == "update_expression"
                or (
                    parent.type == "assignment_expression"
                    and parent.child_by_field_name("left") == node
                )
                or parent.type == "pointer_expression"
            ):
                continue
            element = self.types.get(src.text(array), "").removesuffix(" *")
            bounded = loop.var is not None and loop.op == "<" and loop.start is not None
            if element not in FLOAT_TYPES or not bounded or not self._invariant(node, loop):
                continue
            assert loop.start is not None and loop.bound is not None
            text = src.text(node)
            guard = f"{src.text(loop.start)} < {src.text(loop.bound)}"
            zero = "0.0f" if element == "float" else "0.0"
            name = self._declare(
                loop, "ld", text, f"const {element} @ = {guard} ? {text} : {zero};"
            )
            edits.append(Edit(node.start_byte, node.end_byte, name))
            covered.append(node)
        return edits

    def _loop_of(self, node: Node, loops: list[Loop]) -> Loop | None:
        """The innermost loop whose body holds the node, if nothing conditional lies between."""
        around = [lp for lp in enclosing_loops(node, loops) if inside(node, lp.body)]
        if not around:
            return None
        loop = around[0]
        for a in ancestors(node):
            if a.id == loop.body.id:
                return loop
            if a.type in _CONDITIONAL or (
                a.type == "binary_expression"
                and self.src.text(a.child_by_field_name("operator") or a) in ("&&", "||")
            ):
                return None
        return loop

    def _invariant(self, node: Node, loop: Loop) -> bool:
        src = self.src
        variant = assigned_names(src, loop.body) | src.declared_names(loop.node) | {loop.var or ""}
        written = {a.array for a in body_of(src, loop.body, self.known).accesses if a.write}
        for n in walk(node):
            if n.type in ("assignment_expression", "update_expression", "comma_expression"):
                return False
            if n.type == "call_expression":
                callee = src.text(n.child_by_field_name("function") or n)
                if callee not in PURE_CALLS and not callee.startswith(("kf_", "__builtin_")):
                    return False
            elif n.type == "identifier" and src.text(n) in variant:
                return False
            elif n.type in ("subscript_expression", "pointer_expression"):
                base = next((src.text(i) for i in walk(n) if i.type == "identifier"), "")
                if self.known.get(base, Alias(base, {})).base in written:
                    return False
        return True

    def _float(self, node: Node) -> bool:
        """Whether an expression is computed in floating point (from what it is built of)."""
        src = self.src
        kind = node.type
        if kind == "number_literal":
            return is_float_literal(src.text(node))
        if kind == "identifier":
            return self.types.get(src.text(node), "") in FLOAT_TYPES
        if kind == "subscript_expression":
            array = node.child_by_field_name("argument")
            name = "" if array is None else src.text(array)
            return self.types.get(name, "").removesuffix(" *") in FLOAT_TYPES
        if kind == "call_expression":
            callee = src.text(node.child_by_field_name("function") or node)
            return callee in PURE_CALLS or callee.startswith("kf_")
        if kind == "cast_expression":
            return src.text(node.child_by_field_name("type") or node) in FLOAT_TYPES
        if kind in ("binary_expression", "assignment_expression"):
            parts = (node.child_by_field_name("left"), node.child_by_field_name("right"))
            return any(p is not None and self._float(p) for p in parts)
        return node.named_child_count == 1 and self._float(node.named_children[0])

    def _double(self, node: Node) -> bool:
        src = self.src
        for n in walk(node):
            if n.type == "number_literal":
                text = src.text(n)
                if is_float_literal(text) and not text.lower().endswith("f"):
                    return True
            elif n.type == "identifier" and self.types.get(src.text(n), "") == "double":
                return True
        return False
