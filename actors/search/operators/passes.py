"""Passes: adjacent loops over the same range (the sweeps of a row), whether two of them may
run as one, and strip-mining a run of them into blocks.

Two passes `a` then `b` may be fused (or tiled together) when they count over the same
range, neither reads or writes a scalar the other assigns (a pass that needs the sum the
one before it completes cannot start before it ends), and every array either writes is
accessed by both at one and the same element of the iteration (after naming b's counter
as a's): then running iteration j of a and of b together, or block by block, reads and
writes what running a whole and then b did.
"""

from __future__ import annotations

from collections.abc import Sequence

from tree_sitter import Node

from actors.search.operators.c_ast import CSource, Edit, Loop, apply_edits, walk
from actors.search.operators.dependence import (
    Access,
    Alias,
    Poly,
    assigned_names,
    body_of,
    private_storage,
)
from actors.search.operators.protocol import Refuse

INDENT = "    "


def adjacent_runs(src: CSource, loops: Sequence[Loop]) -> list[list[Loop]]:
    """Runs of two or more for loops that follow each other in one block (comments between
    them allowed), in source order."""
    by_node = {loop.node.id: loop for loop in loops}
    runs: list[list[Loop]] = []
    for loop in loops:
        prev = loop.node.prev_sibling
        while prev is not None and prev.type in ("comment", "preproc_call"):
            prev = prev.prev_sibling
        if prev is not None and prev.id in by_node and runs and runs[-1][-1].node.id == prev.id:
            runs[-1].append(loop)
        else:
            runs.append([loop])
    return [run for run in runs if len(run) > 1]


def same_range(src: CSource, a: Loop, b: Loop) -> bool:
    if a.var is None or b.var is None or a.op != b.op or a.step != b.step:
        return False
    texts = [None if n is None else src.text(n) for n in (a.start, b.start, a.bound, b.bound)]
    return texts[0] == texts[1] and texts[2] == texts[3] and None not in texts


def _renamed(index: Poly | None, old: str, new: str) -> Poly | None:
    if index is None:
        return None
    return {tuple(sorted(new if n == old else n for n in mono)): c for mono, c in index.items()}


def fusable(src: CSource, a: Loop, b: Loop, known: dict[str, Alias]) -> None:
    """Raise `Refuse` unless pass b may run interleaved with pass a (see the module)."""
    line = b.node.start_point.row + 1
    if not same_range(src, a, b):
        raise Refuse("different_range", f"line {line}: the loops do not count over one range")
    assert a.var is not None and b.var is not None
    if a.var != b.var and any(
        n.type == "identifier" and src.text(n) == a.var for n in walk(b.body)
    ):
        raise Refuse("name_clash", f"line {line}: {a.var} means something else in the second loop")
    uses = [{src.text(n) for n in walk(loop.body) if n.type == "identifier"} for loop in (a, b)]
    assigned = [assigned_names(src, lp.body) - src.declared_names(lp.node) for lp in (a, b)]
    shared = (assigned[0] & uses[1]) | (assigned[1] & uses[0])
    if shared:
        raise Refuse(
            "scalar_dependence",
            f"line {line}: {', '.join(sorted(shared))} assigned by one loop and used by the other",
        )
    accesses: list[Access] = []
    for loop in (a, b):
        body = body_of(src, loop.body, known)
        if body.opaque or body.jumps:
            raise Refuse(
                "opaque_call", f"line {line}: a call or jump the fusion cannot see through"
            )
        own = private_storage(src, loop.body)
        accesses += [
            Access(x.array, _renamed(x.index, loop.var or "", a.var), x.write, x.read, x.node)
            for x in body.accesses
            if x.array not in own
        ]
    for array in sorted({x.array for x in accesses if x.write}):
        indexes = {
            repr(sorted((x.index or {("?",): 0}).items())) for x in accesses if x.array == array
        }
        mine = [x.index for x in accesses if x.array == array]
        if len(indexes) != 1 or mine[0] is None or not any(a.var in m for m in mine[0]):
            raise Refuse(
                "carried_dependence",
                f"line {line}: {array} is written by one loop at elements the other reaches "
                "in another iteration",
            )


def fresh(src: CSource, fn: Node, base: str) -> str:
    """`base`, or base_2, base_3, ... : a name the function does not use yet."""
    used = {src.text(n) for n in walk(fn) if n.type == "identifier"}
    name, k = base, 1
    while name in used:
        k += 1
        name = f"{base}_{k}"
    return name


def reindent(text: str, indent: str) -> str:
    """Every line but pragma and blank lines one level deeper."""
    lines = text.split("\n")
    return "\n".join(ln if not ln.strip() or ln.startswith("#") else indent + ln for ln in lines)


def strip_mine(
    src: CSource,
    run: Sequence[Loop],
    block: int,
    names: tuple[str, str],
    inner: Sequence[Edit] = (),
    pragma: str = "",
    tail: Sequence[str] = (),
) -> Edit:
    """The run of passes over [0, bound) as one loop over blocks of `block` elements, each
    pass over the block (`t0` its first element, `tn` its length); `inner` edits apply
    within the run, `pragma` goes on the block loop and `tail` after the passes in it."""
    t0, tn = names
    first, last = run[0], run[-1]
    assert first.bound is not None
    start = src.lines_start(first.node)
    at_line = start == src.line_start(start)
    indent = src.indent(first.node) if at_line else ""
    edits = list(inner)
    for loop in run:
        assert loop.start is not None and loop.bound is not None
        edits.append(Edit(loop.start.start_byte, loop.start.end_byte, t0))
        edits.append(Edit(loop.bound.start_byte, loop.bound.end_byte, f"{t0} + {tn}"))
    local = [Edit(e.start - start, e.end - start, e.text) for e in edits]
    passes = apply_edits(src.data[start : last.node.end_byte], local).decode()
    bound = src.text(first.bound)
    left = f"{bound} - {t0}"
    lines = [f"#pragma {pragma}"] if pragma else []
    lines += [
        f"{indent}for (int64_t {t0} = 0; {t0} < {bound}; {t0} += {block}) {{",
        f"{indent}{INDENT}const int64_t {tn} = {left} < {block} ? {left} : {block};",
        reindent(passes, INDENT),
        *(f"{indent}{INDENT}{line}" for line in tail),
        f"{indent}}}",
    ]
    text = "\n".join(lines)
    return Edit(start, last.node.end_byte, text if at_line else "\n" + text)
