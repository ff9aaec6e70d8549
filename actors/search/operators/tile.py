"""Tile the sweeps of a row into blocks that fit L1 or L2, or keep a row that is read twice
in a buffer.

mode "tile": a run of adjacent passes over one range that may run block by block (see
`passes.fusable`: no pass needs a value the one before completes over the whole range)
becomes one loop over blocks of `block` floats, each pass sweeping the block: what one pass
writes and the next reads is still in cache, and reductions keep their order.

mode "row_buffer": where a row of an output is written by one pass and read again by a
later one (a three-pass softmax writes exp into y, then scales y), the passes before the
last write and read a buffer of the row instead, and the last pass writes the output once,
from it: the output becomes write-only (streamable), and what is re-read is the buffer,
on the stack when the row has at most `block` floats (else allocated for the row; a row
whose allocation fails is left unwritten, and the verifier reports it).

Parameters: mode ("tile", "row_buffer"), block (floats: 4096 = 16 KiB for L1, 1024,
16384 = 64 KiB for L2). Refusals: no_tileable_passes, no_row_read_twice, and for a row
buffer not_a_row, output_read_after_write.
"""

from __future__ import annotations

from typing import ClassVar

from tree_sitter import Node

from actors.search.operators.base import Change, Job, SourceOperator
from actors.search.operators.c_ast import CSource, Edit, Loop, inside
from actors.search.operators.dependence import (
    Access,
    Alias,
    Poly,
    aliases,
    assigned_names,
    body_of,
    names_of,
)
from actors.search.operators.omp_parallel import is_parallel
from actors.search.operators.passes import adjacent_runs, fresh, fusable, strip_mine
from actors.search.operators.protocol import ParamSpace, Refuse

_COMPOUND = {"+=": "+", "-=": "-", "*=": "*", "/=": "/"}


class Tile(SourceOperator):
    name = "tile"
    SPACE: ClassVar[ParamSpace] = {"mode": ("tile", "row_buffer"), "block": (4096, 1024, 16384)}

    def change(self, job: Job) -> Change:
        src, params = job.src, job.params
        fn, loops = job.kernel()
        block = int(params["block"])
        if params["mode"] == "tile":
            edits = _tile(src, fn, loops, block)
        else:
            edits = _row_buffer(src, fn, loops, block)
        return Change(tuple(edits), job.flags)


def _tile(src: CSource, fn: Node, loops: list[Loop], block: int) -> list[Edit]:
    known = aliases(src, fn)
    names = (fresh(src, fn, "kf_t0"), fresh(src, fn, "kf_tn"))
    refused: list[Refuse] = []
    for run in adjacent_runs(src, loops):
        group: list[Loop] = []
        for loop in [*run, None]:
            if loop is not None and _eligible(src, loop):
                try:
                    for earlier in group:
                        fusable(src, earlier, loop, known)
                    group.append(loop)
                    continue
                except Refuse as why:
                    refused.append(why)
            if len(group) > 1:
                return [strip_mine(src, group, block, names)]
            group = [loop] if loop is not None and _eligible(src, loop) else []
    detail = f" ({refused[0].message})" if refused else ""
    raise Refuse("no_tileable_passes", f"no two adjacent passes may run block by block{detail}")


def _eligible(src: CSource, loop: Loop) -> bool:
    """A pass that can be strip-mined: it counts from 0 and no thread team splits it."""
    return loop.counts_up_from_zero(src) and not any(
        is_parallel(src.pragma_words(p)) for p in src.pragmas(loop.node)
    )


def _row_buffer(src: CSource, fn: Node, loops: list[Loop], block: int) -> list[Edit]:
    known = aliases(src, fn)
    outputs = [p.name for p in src.params(fn) if p.pointer and not p.const_target]
    refused: list[Refuse] = []
    for row in [lp for lp in loops if lp.body.type == "compound_statement"]:
        passes = [lp for lp in loops if lp.parent is row and lp.node.parent == row.body]
        for array in outputs:
            try:
                return _buffer_row(src, fn, row, passes, array, known, block)
            except Refuse as why:
                if why.reason != "no_row_read_twice":
                    refused.append(why)
    if refused:
        raise refused[0]
    raise Refuse("no_row_read_twice", "no output row is written by one pass and read by another")


def _buffer_row(
    src: CSource,
    fn: Node,
    row: Loop,
    passes: list[Loop],
    array: str,
    known: dict[str, Alias],
    block: int,
) -> list[Edit]:
    body = body_of(src, row.body, known)
    touching = [a for a in body.accesses if a.array == array]
    users = [lp for lp in passes if any(inside(a.node, lp.body) for a in touching)]
    reads_after = [a for a in touching if a.read and users and not inside(a.node, users[0].body)]
    if len(users) < 2 or not reads_after or not any(a.write for a in touching):
        raise Refuse("no_row_read_twice", f"{array}: no row written and read again")
    line = row.node.start_point.row + 1
    if any(not any(inside(a.node, lp.body) for lp in users) for a in touching):
        raise Refuse("not_a_row", f"line {line}: {array} is accessed outside the row's passes")
    first, last = users[0], users[-1]
    if any(a.read for a in touching if inside(a.node, first.body)):
        raise Refuse("not_a_row", f"line {line}: the first pass reads {array} before it is written")
    bases = {
        repr(_base(src, a, lp, row)) for lp in users for a in touching if inside(a.node, lp.body)
    }
    bound = {src.text(lp.bound) for lp in users if lp.bound is not None}
    if (
        len(bases) != 1
        or "None" in bases
        or len(bound) != 1
        or not all(lp.counts_up_from_zero(src) for lp in users)
    ):
        raise Refuse("not_a_row", f"line {line}: {array} is not swept as one row by its passes")
    final = [a for a in touching if inside(a.node, last.body) and a.write]
    statement = _write_statement(final[0]) if len(final) == 1 else None
    if statement is None or any(
        a.read and a.node.start_byte > statement.end_byte
        for a in touching
        if inside(a.node, last.body)
    ):
        raise Refuse(
            "output_read_after_write", f"line {line}: the last pass must write {array} once, last"
        )
    buffer, stack = fresh(src, fn, f"kf_row_{array}"), fresh(src, fn, f"kf_stack_{array}")
    (n,) = bound
    edits: list[Edit] = []
    for lp in users:
        for a in touching:
            if inside(a.node, lp.body) and a is not final[0]:
                edits.append(Edit(a.node.start_byte, a.node.end_byte, f"{buffer}[{lp.var}]"))
    edits += _last_write(src, final[0], f"{buffer}[{last.var}]")
    edits += src.insert_lines_before(
        first.node,
        [
            f"float {stack}[{block}];",
            f"float *{buffer} = {n} <= {block} ? {stack} : "
            f"(float *)malloc((size_t)({n}) * sizeof(float));",
            f"if ({buffer} == NULL) continue;",
        ],
    )
    indent = src.indent(last.node)
    edits.append(
        Edit(
            last.node.end_byte,
            last.node.end_byte,
            f"\n{indent}if ({buffer} != {stack}) free({buffer});",
        )
    )
    edits += src.include("#include <stdlib.h>")
    return edits


def _base(src: CSource, access: Access, loop: Loop, row: Loop) -> Poly | None:
    """The row's first element an access of a pass is relative to: its index less the
    pass's counter (None unless the index is that plus names the row's body never sets)."""
    if access.index is None or loop.var is None or access.index.get((loop.var,)) != 1:
        return None
    base = {m: c for m, c in access.index.items() if m != (loop.var,)}
    variant = assigned_names(src, row.body) | src.declared_names(row.body) | {loop.var}
    return None if names_of(base) & variant else base


def _write_statement(access: Access) -> Node | None:
    parent = access.node.parent
    if parent is not None and parent.type == "assignment_expression":
        return parent
    return None


def _last_write(src: CSource, access: Access, buffered: str) -> list[Edit]:
    """The last pass's write of the output, reading the buffer where it read the output."""
    assign = _write_statement(access)
    assert assign is not None
    operator = assign.child_by_field_name("operator")
    right = assign.child_by_field_name("right")
    assert operator is not None and right is not None
    op = src.text(operator)
    if op == "=":
        return []
    return [
        Edit(operator.start_byte, operator.end_byte, "="),
        Edit(right.start_byte, right.end_byte, f"{buffered} {_COMPOUND[op]} ({src.text(right)})"),
    ]
