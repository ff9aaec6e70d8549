"""What a loop reads and writes, and whether its iterations are independent.

Array indexes are read as polynomials over the names in them (`r * cols + j` is
{(cols, r): 1, (j,): 1}); a local pointer declared as `p = q + offset` (or `&q[offset]`)
and never assigned again is an alias of q, its accesses q's at the offset. An index that is
not a polynomial (a division, a load, a call) is unknown.

A loop over `i` is independent when every array it writes is touched, in iteration i, only
in a strip no other iteration touches: every access of that array is either at the same
index `i + c` (c invariant), or at `i * M + v` with M a product of invariant names and v the
variable of an inner loop `for (v = 0; v < M; ++v)` (a row of a row-wise kernel), or
nothing of `i` at all only when the array is never written. A scalar declared outside the
loop and assigned in it must be a reduction (`s += e`, `s = s * e`, `m = fmaxf(m, e)`,
`m = e > m ? e : m`, ...; used nowhere else in the loop) or the counter of an inner loop
(private). Calls other than the maths library's and the kernel's own `kf_` helpers, writes
through unknown pointers, and `break`/`return`/`goto` are refused. What cannot be proven is
refused with a reason; the verifier judges the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from tree_sitter import Node

from actors.search.operators.c_ast import (
    CSource,
    Loop,
    ancestors,
    declarator_name,
    enclosing_loops,
    integer_literal,
    named_descendants,
    walk,
)
from actors.search.operators.protocol import Refuse

Monomial = tuple[str, ...]
Poly = dict[Monomial, int]
PURE_CALLS = frozenset(
    {
        *(
            f"{f}{s}"
            for f in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt")
            for s in ("", "f")
        ),
        *(
            f"{f}{s}"
            for f in ("tanh", "erf", "erfc", "fabs", "fmax", "fmin", "pow")
            for s in ("", "f")
        ),
        *(
            f"{f}{s}"
            for f in ("sin", "cos", "floor", "ceil", "round", "rint", "trunc")
            for s in ("", "f")
        ),
        *(f"{f}{s}" for f in ("fma", "copysign", "cbrt", "ldexp", "nearbyint") for s in ("", "f")),
    }
)
"""Functions of the maths library: no side effect a loop transformation must keep in order."""
ALLOCATORS = frozenset({"malloc", "calloc", "aligned_alloc"})
"""Memory a loop iteration allocates (and frees) is its own."""
STREAM_CALL = "kf_stream_row"
"""The helper that rewrites p[0, n) with non-temporal stores: a write of that range."""
RANGE_SUFFIX = "@range"


def poly(src: CSource, node: Node | None) -> Poly | None:
    """An integer expression as a polynomial over its names, or None."""
    if node is None:
        return None
    kind = node.type
    if kind == "identifier":
        return {(src.text(node),): 1}
    if kind == "number_literal":
        value = integer_literal(src.text(node))
        return None if value is None else ({(): value} if value else {})
    if kind == "parenthesized_expression":
        return poly(src, node.named_children[0]) if node.named_child_count == 1 else None
    if kind == "cast_expression":
        return poly(src, node.child_by_field_name("value"))
    if kind == "unary_expression":
        operator = node.child_by_field_name("operator")
        inner = poly(src, node.child_by_field_name("argument"))
        if inner is None or operator is None or src.text(operator) not in "+-":
            return None
        return inner if src.text(operator) == "+" else scale(inner, -1)
    if kind == "binary_expression":
        operator = node.child_by_field_name("operator")
        left = poly(src, node.child_by_field_name("left"))
        right = poly(src, node.child_by_field_name("right"))
        if left is None or right is None or operator is None:
            return None
        op = src.text(operator)
        if op == "+":
            return add(left, right)
        if op == "-":
            return add(left, scale(right, -1))
        if op == "*":
            return multiply(left, right)
    return None


def add(a: Poly, b: Poly) -> Poly:
    out = dict(a)
    for mono, coeff in b.items():
        out[mono] = out.get(mono, 0) + coeff
        if out[mono] == 0:
            del out[mono]
    return out


def scale(a: Poly, k: int) -> Poly:
    return {m: c * k for m, c in a.items() if c * k}


def multiply(a: Poly, b: Poly) -> Poly:
    out: Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            out = add(out, {tuple(sorted(ma + mb)): ca * cb})
    return out


def names_of(p: Poly) -> set[str]:
    return {name for mono in p for name in mono}


@dataclass(frozen=True)
class Alias:
    base: str
    offset: Poly


def aliases(src: CSource, fn: Node) -> dict[str, Alias]:
    """Local pointers that stand for a parameter at an offset (`p = q + off`, `&q[off]`),
    declared once and never assigned again; chains resolve to the parameter."""
    declared: dict[str, list[Node]] = {}
    for decl in named_descendants(src.body(fn), "init_declarator"):
        target = decl.child_by_field_name("declarator")
        if target is not None and target.type == "pointer_declarator":
            inner = target.child_by_field_name("declarator")
            if inner is not None and inner.type == "identifier":
                declared.setdefault(src.text(inner), []).append(decl)
    assigned = assigned_names(src, src.body(fn))
    found: dict[str, Alias] = {}
    for name, decls in declared.items():
        values = {src.text(v) for d in decls if (v := d.child_by_field_name("value")) is not None}
        if name in assigned or len(values) != 1:
            continue
        value = decls[0].child_by_field_name("value")
        alias = _pointer_value(src, value, found)
        if alias is not None:
            found[name] = alias
    return found


def _pointer_value(src: CSource, node: Node | None, known: dict[str, Alias]) -> Alias | None:
    if node is None:
        return None
    while node.type in ("parenthesized_expression", "cast_expression"):
        inner = node.child_by_field_name("value") if node.type == "cast_expression" else None
        node = inner if inner is not None else node.named_children[0]
    if node.type == "identifier":
        name = src.text(node)
        return known.get(name, Alias(name, {}))
    if node.type == "pointer_expression":  # &q[off]
        arg = node.child_by_field_name("argument")
        if arg is not None and arg.type == "subscript_expression":
            base = _pointer_value(src, arg.child_by_field_name("argument"), known)
            index = poly(src, arg.child_by_field_name("index"))
            if base is not None and index is not None:
                return Alias(base.base, add(base.offset, index))
        return None
    if node.type == "binary_expression":
        operator = node.child_by_field_name("operator")
        base = _pointer_value(src, node.child_by_field_name("left"), known)
        offset = poly(src, node.child_by_field_name("right"))
        if base is None or offset is None or operator is None or src.text(operator) not in "+-":
            return None
        sign = 1 if src.text(operator) == "+" else -1
        return Alias(base.base, add(base.offset, scale(offset, sign)))
    return None


def assigned_names(src: CSource, node: Node) -> set[str]:
    """Identifiers assigned (=, op=, ++, --) anywhere inside `node`."""
    names: set[str] = set()
    for n in walk(node):
        target = _assigned(n)
        if target is not None and target.type == "identifier":
            names.add(src.text(target))
    return names


def _assigned(node: Node) -> Node | None:
    if node.type == "assignment_expression":
        return node.child_by_field_name("left")
    if node.type == "update_expression":
        return node.child_by_field_name("argument")
    return None


@dataclass(frozen=True)
class Access:
    """One access to an array: its base (a parameter, or a local array or pointer), its
    index (None: unknown), whether it writes and whether it reads."""

    array: str
    index: Poly | None
    write: bool
    read: bool
    node: Node


@dataclass
class Body:
    """What a piece of code does: its array accesses, the names it assigns, declares and
    calls, the calls it cannot see through, and the ranges of the inner ranges it writes
    through helpers (name -> bound)."""

    accesses: list[Access] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)
    ranges: dict[str, Poly] = field(default_factory=dict)
    jumps: list[str] = field(default_factory=list)


def body_of(src: CSource, node: Node, known: dict[str, Alias]) -> Body:
    """The accesses, opaque calls and jumps inside `node`."""
    found = Body()
    for n in walk(node):
        if n.type == "subscript_expression":
            found.accesses.append(_subscript(src, n, known))
        elif n.type == "pointer_expression" and _operator(src, n) == "*":
            found.accesses.append(_dereference(src, n, known))
        elif n.type == "call_expression":
            _call(src, n, known, found)
        elif n.type in ("return_statement", "goto_statement"):
            found.jumps.append(n.type.split("_")[0])
        elif n.type == "break_statement" and not _breaks_inner(n, node):
            found.jumps.append("break")
    return found


def _operator(src: CSource, node: Node) -> str:
    operator = node.child_by_field_name("operator")
    return "" if operator is None else src.text(operator)


def _breaks_inner(node: Node, outer: Node) -> bool:
    """A `break` that leaves a loop or switch inside `outer`, not `outer` itself."""
    parent = node.parent
    while parent is not None and parent.id != outer.id:
        if parent.type in ("for_statement", "while_statement", "do_statement", "switch_statement"):
            return True
        parent = parent.parent
    return False


def _direction(node: Node, src: CSource) -> tuple[bool, bool]:
    """(write, read) of the lvalue-or-value `node` in its context."""
    parent = node.parent
    while parent is not None and parent.type == "parenthesized_expression":
        node, parent = parent, parent.parent
    if parent is None:
        return False, True
    if parent.type == "assignment_expression":
        left = parent.child_by_field_name("left")
        if left is not None and left.id == node.id:
            return True, _operator(src, parent) != "="
    if parent.type == "update_expression":
        return True, True
    return False, True


def _subscript(src: CSource, node: Node, known: dict[str, Alias]) -> Access:
    write, read = _direction(node, src)
    arg = node.child_by_field_name("argument")
    index = poly(src, node.child_by_field_name("index"))
    if arg is None or arg.type != "identifier":
        base = next((src.text(n) for n in walk(node) if n.type == "identifier"), "?")
        return Access(base, None, write, read, node)
    name = src.text(arg)
    alias = known.get(name, Alias(name, {}))
    return Access(
        alias.base, None if index is None else add(alias.offset, index), write, read, node
    )


def _dereference(src: CSource, node: Node, known: dict[str, Alias]) -> Access:
    write, read = _direction(node, src)
    target = _pointer_value(src, node.child_by_field_name("argument"), known)
    if target is None:
        base = next((src.text(n) for n in walk(node) if n.type == "identifier"), "?")
        return Access(base, None, write, read, node)
    return Access(target.base, target.offset, write, read, node)


def _call(src: CSource, node: Node, known: dict[str, Alias], found: Body) -> None:
    function = node.child_by_field_name("function")
    name = "" if function is None else src.text(function)
    if (
        name in PURE_CALLS
        or name in pure_functions(src.source)
        or name in ALLOCATORS
        or name == "free"
        or name.startswith("__builtin_")
        or (name.startswith("kf_") and name != STREAM_CALL)
    ):
        return
    args = node.child_by_field_name("arguments")
    if name == STREAM_CALL and args is not None and args.named_child_count == 2:
        target = _pointer_value(src, args.named_children[0], known)
        count = poly(src, args.named_children[1])
        if target is not None and count is not None:
            var = f"{node.start_byte}{RANGE_SUFFIX}"
            found.ranges[var] = count
            index = add(target.offset, {(var,): 1})
            found.accesses.append(Access(target.base, index, True, True, node))
            return
    found.opaque.append(name or src.text(node))


_MEMORY = frozenset({"subscript_expression", "pointer_expression", "field_expression"})


@functools.lru_cache(maxsize=64)
def pure_functions(text: str) -> frozenset[str]:
    """The functions of the file (`text`) a loop may call as freely as the maths library's:
    scalar parameters only, and a body that touches no memory (no subscript, dereference,
    address or field), declares no static or extern, assigns only its parameters and its
    own locals, and calls only the maths library and other such functions (a clamp or an
    activation the user wrote as a helper)."""
    src = CSource(text)
    found = {
        name: fn
        for name, fn in src.functions().items()
        if name != "kernel" and not any(p.pointer for p in src.params(fn))
    }
    pure = set(found)
    while True:
        impure = {name for name in pure if not _touches_nothing(src, found[name], pure)}
        if not impure:
            return frozenset(pure)
        pure -= impure


def _touches_nothing(src: CSource, fn: Node, pure: set[str]) -> bool:
    own = {p.name for p in src.params(fn)}
    for node in walk(fn):
        if node.type in _MEMORY:
            return False
        in_body = node.parent is not None and node.parent.type == "declaration"
        if node.type == "storage_class_specifier" and in_body:
            return False  # a static (state kept across calls) or an extern (a global)
        if node.type == "declaration":
            for declared in node.children_by_field_name("declarator"):
                if declared.type == "init_declarator":
                    declared = declared.child_by_field_name("declarator") or declared
                if declared.type != "identifier":
                    return False  # an array or pointer local
                own.add(src.text(declared))
        if node.type == "call_expression":
            callee = node.child_by_field_name("function")
            name = "" if callee is None else src.text(callee)
            if not (name in PURE_CALLS or name in pure or name.startswith("__builtin_")):
                return False
    return assigned_names(src, fn) <= own and not _assigns_other(src, fn)


def _assigns_other(src: CSource, fn: Node) -> bool:
    """Whether something other than a plain name is assigned in `fn`."""
    return any(
        (target := _assigned(n)) is not None and target.type != "identifier" for n in walk(fn)
    )


# reductions -------------------------------------------------------------------------

REDUCTION_OPS = ("+", "*", "max", "min")
_MAX_CALLS = {"fmaxf": "max", "fmax": "max", "fminf": "min", "fmin": "min"}
_COMPARE = {">": "max", ">=": "max", "<": "min", "<=": "min"}


@dataclass(frozen=True)
class Reduction:
    """A scalar a loop reduces into: its name, the OpenMP operator, the statements."""

    var: str
    op: str
    statements: tuple[Node, ...]


def reduction_clauses(found: Sequence[Reduction]) -> list[str]:
    """`reduction(op:vars)` clauses, one per operator, in the order the reductions come."""
    by_op: dict[str, list[str]] = {}
    for r in found:
        by_op.setdefault(r.op, []).append(r.var)
    return [f"reduction({op}:{', '.join(names)})" for op, names in by_op.items()]


def reduction_kind(src: CSource, assign: Node, var: str) -> str | None:
    """The reduction operator of an assignment to `var` (`var op= e`, `var = var op e`,
    `var = fmaxf(var, e)`, `var = e > var ? e : var`, ...), None if it is not one."""
    op = _operator(src, assign)
    right = assign.child_by_field_name("right")
    if right is None:
        return None
    uses = [n for n in walk(right) if n.type == "identifier" and src.text(n) == var]
    if op in ("+=", "-=", "*="):
        return None if uses else ("*" if op == "*=" else "+")
    guard = guard_of(assign)
    if op == "=" and not uses and guard is not None:
        return _guarded_kind(src, guard, right, var)
    if op != "=" or len(uses) != _expected_uses(right):
        return None
    right = _unparen(right)
    if right.type == "binary_expression":
        left_operand, right_operand = (
            right.child_by_field_name("left"),
            right.child_by_field_name("right"),
        )
        kind = _operator(src, right)
        mine = [n for n in (left_operand, right_operand) if n is not None and _is(src, n, var)]
        if kind in ("+", "*") and len(mine) == 1:
            return kind
        if kind == "-" and left_operand is not None and _is(src, left_operand, var):
            return "+"
        return None
    if right.type == "call_expression":
        function = right.child_by_field_name("function")
        args = right.child_by_field_name("arguments")
        extreme = _MAX_CALLS.get("" if function is None else src.text(function))
        two = args is not None and args.named_child_count == 2
        if (
            extreme
            and two
            and args is not None
            and any(_is(src, a, var) for a in args.named_children)
        ):
            return extreme
        return None
    if right.type == "conditional_expression":
        return _select_kind(src, right, var)
    return None


def guard_of(assign: Node) -> Node | None:
    """The if statement whose only effect is this assignment (`if (c) m = e;`, no else)."""
    statement = assign.parent
    if statement is None or statement.type != "expression_statement":
        return None
    node = statement.parent
    if node is not None and node.type == "compound_statement" and node.named_child_count == 1:
        node = node.parent
    if node is None or node.type != "if_statement":
        return None
    if node.child_by_field_name("alternative") is not None:
        return None
    return node


def _guarded_kind(src: CSource, guard: Node, value: Node, var: str) -> str | None:
    """`if (e > m) m = e;` is a max (and `m < e`; min with the other comparisons)."""
    cond = guard.child_by_field_name("condition")
    if cond is None:
        return None
    cond = _unparen(cond)
    a, b = cond.child_by_field_name("left"), cond.child_by_field_name("right")
    op = _operator(src, cond) if cond.type == "binary_expression" else ""
    if a is None or b is None or op not in _COMPARE:
        return None
    e = src.text(_unparen(value))
    if _is(src, b, var) and src.text(_unparen(a)) == e:
        return _COMPARE[op]
    if _is(src, a, var) and src.text(_unparen(b)) == e:
        return "min" if _COMPARE[op] == "max" else "max"
    return None


def _expected_uses(right: Node) -> int:
    """How often the reduced variable appears in the right side of its reduction: twice in
    a select (`e > m ? e : m`), once otherwise."""
    return 2 if _unparen(right).type == "conditional_expression" else 1


def _unparen(node: Node) -> Node:
    while node.type == "parenthesized_expression" and node.named_child_count == 1:
        node = node.named_children[0]
    return node


def _is(src: CSource, node: Node, var: str) -> bool:
    node = _unparen(node)
    return node.type == "identifier" and src.text(node) == var


def _select_parts(src: CSource, select: Node) -> tuple[str, Node, Node, Node, Node] | None:
    """`a OP b ? then : other`, OP a comparison: (OP, a, b, then, other)."""
    cond = select.child_by_field_name("condition")
    then = select.child_by_field_name("consequence")
    other = select.child_by_field_name("alternative")
    if cond is None or then is None or other is None:
        return None
    cond = _unparen(cond)
    a, b = cond.child_by_field_name("left"), cond.child_by_field_name("right")
    if cond.type != "binary_expression" or a is None or b is None:
        return None
    return _operator(src, cond), a, b, then, other


def _select_kind(src: CSource, select: Node, var: str) -> str | None:
    parts = _select_parts(src, select)
    if parts is None or parts[0] not in _COMPARE:
        return None
    op, a, b, then, other = parts
    kind = _COMPARE[op]
    # e > m ? e : m (max), m > e ? m : e (max), e < m ? e : m (min), m < e ? m : e (min)
    if _is(src, b, var) and _is(src, other, var) and src.text(a) == src.text(then):
        return kind
    if _is(src, a, var) and _is(src, then, var) and src.text(b) == src.text(other):
        return kind
    return None


def reductions(src: CSource, loop: Loop, outside: set[str]) -> tuple[list[Reduction], list[str]]:
    """The reductions of a loop into scalars declared outside it (`outside`), and the
    other names declared outside it that the loop assigns (each a dependence, unless it is
    an inner loop's counter)."""
    by_var: dict[str, list[Node]] = {}
    for n in walk(loop.body):
        target = _assigned(n)
        if target is not None and target.type == "identifier" and src.text(target) in outside:
            by_var.setdefault(src.text(target), []).append(n)
    found: list[Reduction] = []
    others: list[str] = []
    for var, assigns in by_var.items():
        kinds = {
            reduction_kind(src, a, var) if a.type == "assignment_expression" else None
            for a in assigns
        }
        uses = [n for n in walk(loop.body) if n.type == "identifier" and src.text(n) == var]
        covered = sum(1 + _uses_in(src, a, var) for a in assigns)
        if len(kinds) == 1 and None not in kinds and len(uses) == covered:
            kind = kinds.pop()
            assert kind is not None
            found.append(Reduction(var, kind, tuple(assigns)))
        else:
            others.append(var)
    return found, others


def _uses_in(src: CSource, assign: Node, var: str) -> int:
    """Uses of `var` in the assignment's right side, and in the condition guarding it."""
    guard = guard_of(assign)
    parts = [assign.child_by_field_name("right")]
    if guard is not None:
        parts.append(guard.child_by_field_name("condition"))
    return sum(
        1
        for part in parts
        if part is not None
        for n in walk(part)
        if n.type == "identifier" and src.text(n) == var
    )


# independence -------------------------------------------------------------------------


@dataclass(frozen=True)
class Independence:
    """A loop whose iterations may run in any order: its reductions and the names that
    must be private to each iteration (inner counters declared outside it)."""

    loop: Loop
    reductions: tuple[Reduction, ...]
    private: tuple[str, ...]


def independence(src: CSource, fn: Node, loop: Loop, all_loops: Sequence[Loop]) -> Independence:
    """Prove the loop's iterations independent, or raise `Refuse` with the reason."""
    if loop.var is None or loop.step is None or loop.op not in ("<", "<=", ">", ">="):
        raise Refuse("not_canonical", f"line {_line(loop.node)}: not a counted loop")
    var = loop.var
    inside = src.declared_names(loop.node)
    declared = set(src.declared_types(fn))
    assigned = assigned_names(src, loop.body)
    if var in assigned:
        raise Refuse(
            "not_canonical", f"line {_line(loop.node)}: the loop assigns its counter {var}"
        )
    inner = [lp for lp in all_loops if lp.node.id != loop.node.id and _within(lp.node, loop.node)]
    counters = {lp.var for lp in inner if lp.var is not None and not lp.declares_var}
    outside = (declared | assigned) - inside - {var}
    found, others = reductions(src, loop, outside - counters)
    if others:
        raise Refuse(
            "scalar_dependence",
            f"line {_line(loop.node)}: {', '.join(sorted(others))} declared outside the loop "
            "and assigned in it (not a reduction)",
        )
    known = aliases(src, fn)
    body = body_of(src, loop.body, known)
    if body.opaque:
        raise Refuse(
            "opaque_call", f"line {_line(loop.node)}: calls {', '.join(sorted(set(body.opaque)))}"
        )
    if body.jumps:
        raise Refuse("control_flow", f"line {_line(loop.node)}: {body.jumps[0]} leaves the loop")
    variant = assigned | inside | {var}
    storage = private_storage(src, loop.body)
    pointers = {n for n, kind in src.declared_types(fn).items() if kind.endswith("*")}
    owned = private_storage(src, src.body(fn)) - assigned_names(src, src.body(fn))
    unknown = pointers - {p.name for p in src.params(fn)} - set(known) - owned
    _check_arrays(src, loop, body, inner, variant, storage, unknown)
    return Independence(loop, tuple(found), tuple(sorted(counters - inside)))


def private_storage(src: CSource, node: Node) -> set[str]:
    """Arrays declared inside `node`, and pointers it declares to memory it allocates or to
    such arrays (`p = n <= 64 ? buf : malloc(...)`): storage of its own, which no parameter
    aliases and no other iteration of a loop around `node` sees."""
    names: set[str] = set()
    pointers: list[tuple[str, Node]] = []
    for decl in named_descendants(node, "declaration"):
        for d in decl.children_by_field_name("declarator"):
            inner = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
            value = d.child_by_field_name("value") if d.type == "init_declarator" else None
            name = declarator_name(d)
            if name is not None and inner is not None and inner.type == "array_declarator":
                names.add(name)
            elif name is not None and value is not None:
                pointers.append((name, value))
    for name, value in pointers:
        if _owned(src, value, names):
            names.add(name)
    return names


def _owned(src: CSource, value: Node, storage: set[str]) -> bool:
    """Whether a pointer's value is allocated memory or one of the storage arrays."""
    value = _unparen(value)
    if value.type == "cast_expression":
        inner = value.child_by_field_name("value")
        return inner is not None and _owned(src, inner, storage)
    if value.type == "conditional_expression":
        branches = (
            value.child_by_field_name("consequence"),
            value.child_by_field_name("alternative"),
        )
        return all(b is not None and _owned(src, b, storage) for b in branches)
    if value.type == "call_expression":
        return src.text(value.child_by_field_name("function") or value) in ALLOCATORS
    return value.type == "identifier" and src.text(value) in storage


def _within(node: Node, outer: Node) -> bool:
    return outer.start_byte <= node.start_byte and node.end_byte <= outer.end_byte


def _line(node: Node) -> int:
    return node.start_point.row + 1


def _check_arrays(
    src: CSource,
    loop: Loop,
    body: Body,
    inner: list[Loop],
    variant: set[str],
    storage: set[str],
    unknown_pointers: set[str],
) -> None:
    written = {a.array for a in body.accesses if a.write} - storage
    for array in sorted(written):
        if array in unknown_pointers or array == "?":
            raise Refuse(
                "unknown_alias",
                f"line {_line(loop.node)}: writes through {array}, a pointer that is not a "
                "parameter at a fixed offset",
            )
        accesses = [a for a in body.accesses if a.array == array]
        unknown = [a for a in accesses if a.index is None]
        if unknown:
            raise Refuse(
                "unknown_index",
                f"line {_line(unknown[0].node)}: {array} is written and accessed at an index "
                "that is not a polynomial of the loop's counters",
            )
        classes = {_strip(src, a, loop, inner, variant, body.ranges) for a in accesses}
        if len(classes) != 1 or None in classes:
            raise Refuse(
                "carried_dependence",
                f"line {_line(loop.node)}: {array} is written in one iteration of the loop over "
                f"{loop.var} and may be accessed in another",
            )


def _strip(
    src: CSource,
    access: Access,
    loop: Loop,
    inner: list[Loop],
    variant: set[str],
    ranges: dict[str, Poly],
) -> tuple[Monomial, str] | None:
    """Which elements an access may touch in iteration `var`, as a class every access of a
    written array must share: ((), 'i + rest') for the index itself, (M, '') for the strip
    var * M + [0, M); None if it cannot be told."""
    index = access.index
    assert index is not None and loop.var is not None
    var = loop.var
    with_var = {m: c for m, c in index.items() if var in m}
    rest = {m: c for m, c in index.items() if var not in m}
    if len(with_var) != 1:
        return None
    ((mono, coeff),) = with_var.items()
    width = tuple(n for n in mono if n != var)
    if mono.count(var) != 1 or coeff != 1 or names_of({width: 1}) & variant:
        return None
    if not width:
        if names_of(rest) & variant:
            return None
        return (), repr(sorted(rest.items()))
    bounds = _Bounds(src, loop, inner, variant, ranges, access.node)
    low, high = bounds.of(rest, upper=False), bounds.of(rest, upper=True)
    if low is None or high is None:
        return None
    above = add(high, {width: -1})
    if set(low) - {()} or low.get((), 0) < 0 or set(above) - {()} or above.get((), 0) > -1:
        return None
    return width, ""


class _Bounds:
    """Lower and upper bounds, as polynomials of invariant names, of what an index adds to
    the strip of a loop's iteration. Names are replaced by their bounds one at a time (helper
    ranges [0, n) first, then constant locals, then counters from the innermost out), so that
    `t0 + tn - 1` with `tn = n - t0 < B ? n - t0 : B` comes to n - 1: counters by their loop
    headers (`v < B`, `v + C <= B`, from their start), constant locals by their values (an
    upper bound of `a < b ? a : b` is a)."""

    def __init__(
        self,
        src: CSource,
        loop: Loop,
        inner: list[Loop],
        variant: set[str],
        ranges: dict[str, Poly],
        node: Node,
    ) -> None:
        self.src, self.loop, self.variant, self.ranges = src, loop, variant, ranges
        self.node = node
        self.around = enclosing_loops(node, inner)

    def of(self, p: Poly, upper: bool) -> Poly | None:
        for _ in range(16):
            names = names_of(p) & (self.variant | set(self.ranges))
            if not names:
                return p
            name = min(names, key=self._order)
            terms = {m: c for m, c in p.items() if name in m}
            if any(m != (name,) for m in terms):
                return None
            coeff = terms[(name,)]
            bound = self._name(name, upper=(coeff > 0) == upper)
            if bound is None:
                return None
            p = add(add(p, {(name,): -coeff}), scale(bound, coeff))
        return None

    def _order(self, name: str) -> tuple[int, int, str]:
        counters = [lp.var for lp in self.around]
        if name in self.ranges:
            return 0, 0, name
        if name not in counters:
            return 1, 0, name
        return 2, counters.index(name), name

    def _name(self, name: str, upper: bool) -> Poly | None:
        if name in self.ranges:
            return add(self.ranges[name], {(): -1}) if upper else {}
        counting = [lp for lp in self.around if lp.var == name]
        if counting:
            return self._counter(counting[0], upper)
        found = self._declared(name, self.node)
        if found is None:
            return None
        sets = self._sets(name, found[1])
        if sets and (upper or not all(_increases(self.src, n) for n in sets)):
            return None
        value: Node | None = found[0]
        if upper and value is not None and value.type == "conditional_expression":
            value = _smaller(self.src, value)
        return poly(self.src, value)

    def _counter(self, lp: Loop, upper: bool) -> Poly | None:
        name = lp.var
        assert name is not None
        if lp.step is None or lp.step <= 0 or name in assigned_names(self.src, lp.body):
            return None
        if upper:
            return _limit(self.src, lp)
        if lp.start is not None:
            return poly(self.src, lp.start)
        found = self._declared(name, lp.node)
        update = lp.node.child_by_field_name("update")
        if found is None or update is None:
            return None
        if any(not _within(n, update) for n in self._sets(name, found[1])):
            return None
        return poly(self.src, found[0])

    def _declared(self, name: str, at: Node) -> tuple[Node, Node] | None:
        """The value a local is declared with in the nearest block around `at` inside the
        loop, and that block."""
        for block in ancestors(at):
            if block.type == "compound_statement":
                for decl in block.named_children:
                    if decl.type != "declaration":
                        continue
                    for d in decl.children_by_field_name("declarator"):
                        value = d.child_by_field_name("value")
                        if declarator_name(d) == name and value is not None:
                            return value, block
            if block.id == self.loop.body.id:
                return None
        return None

    def _sets(self, name: str, block: Node) -> list[Node]:
        return [
            n for n in walk(block) if (t := _assigned(n)) is not None and self.src.text(t) == name
        ]


def _increases(src: CSource, node: Node) -> bool:
    """`v++`, `++v` or `v += c` with c > 0: the value only grows."""
    if node.type == "update_expression":
        return _operator(src, node) == "++"
    right = node.child_by_field_name("right")
    value = None if right is None else integer_literal(src.text(right))
    return _operator(src, node) == "+=" and value is not None and value > 0


def _smaller(src: CSource, select: Node) -> Node | None:
    """`a < b ? a : b` (or <=): a, an upper bound of the select."""
    parts = _select_parts(src, select)
    if parts is None or parts[0] not in ("<", "<="):
        return None
    _, a, b, then, other = parts
    return then if src.text(a) == src.text(then) and src.text(b) == src.text(other) else None


def _limit(src: CSource, lp: Loop) -> Poly | None:
    """The largest value a counter takes, from its condition `v + r < q` or `v + r <= q`."""
    cond = lp.node.child_by_field_name("condition")
    if cond is None or cond.type != "binary_expression" or lp.var is None:
        return None
    op = _operator(src, cond)
    left, right = (
        poly(src, cond.child_by_field_name("left")),
        poly(src, cond.child_by_field_name("right")),
    )
    if op not in ("<", "<=") or left is None or right is None or left.get((lp.var,)) != 1:
        return None
    rest = {m: c for m, c in left.items() if m != (lp.var,)}
    if lp.var in names_of(rest) or lp.var in names_of(right):
        return None
    return add(add(right, scale(rest, -1)), {(): -1} if op == "<" else {})
