"""Non-temporal stores for write-only outputs.

An output the kernel only writes (never reads, compound assignments included), written by
one pass `for (j = 0; j < n; ++j) y[base + j] = ...`, is streamed to memory once its values
are made: `kf_stream_row` (the fused kernels' helper, from `_stream_row.c.j2`) rewrites the
finished range with non-temporal stores and fences, so the output leaves the cache to the
inputs. With chunk 0 the whole row goes after the pass, which must then be inside a loop
over rows (a row is still in cache; a whole array is not); with a chunk, the pass is
strip-mined into blocks of that many floats and each block is streamed as it is finished
(an `omp parallel for` on the pass moves to the block loop, its `simd` stays on the pass).

Parameters: chunk (0, 1024, 4096). Refusals: no_write_only_output (an output that is read,
as the three-pass softmax reads y: buffer its row first), not_a_pass, whole_array,
already_streamed.
"""

from __future__ import annotations

from typing import ClassVar

from tree_sitter import Node

from actors.search.operators.base import Change, Job, SourceOperator
from actors.search.operators.c_ast import CSource, Edit, Loop, inside, pragma_parts
from actors.search.operators.dependence import (
    STREAM_CALL,
    Access,
    Poly,
    aliases,
    assigned_names,
    body_of,
    names_of,
)
from actors.search.operators.helpers import insert_helpers
from actors.search.operators.passes import fresh, strip_mine
from actors.search.operators.protocol import ParamSpace, Refuse

_OUTER = ("schedule", "num_threads", "reduction", "private", "firstprivate", "lastprivate")
_INNER = ("simdlen", "safelen", "reduction", "aligned", "linear")


class Nontemporal(SourceOperator):
    name = "nontemporal"
    SPACE: ClassVar[ParamSpace] = {"chunk": (0, 1024, 4096)}

    def change(self, job: Job) -> Change:
        src, params = job.src, job.params
        fn, loops = job.kernel()
        known = aliases(src, fn)
        accesses = body_of(src, src.body(fn), known).accesses
        outputs = [p.name for p in src.params(fn) if p.pointer and not p.const_target]
        streamed = {a.array for a in accesses if src.text(a.node).startswith(STREAM_CALL)}
        write_only = [
            y
            for y in outputs
            if y not in streamed and not any(a.read for a in accesses if a.array == y)
        ]
        if not write_only:
            why = "already streamed" if streamed else "read by the kernel"
            raise Refuse(
                "already_streamed" if streamed else "no_write_only_output",
                f"every output is {why}",
            )
        edits: list[Edit] = []
        refused: list[Refuse] = []
        for array in write_only:
            try:
                edits += self._stream(
                    src, fn, loops, [a for a in accesses if a.array == array], int(params["chunk"])
                )
            except Refuse as why:
                refused.append(why)
        if not edits:
            raise refused[0]
        edits += insert_helpers(src, [STREAM_CALL])
        return Change(tuple(edits), job.flags)

    def _stream(
        self, src: CSource, fn: Node, loops: list[Loop], writes: list[Access], chunk: int
    ) -> list[Edit]:
        array = writes[0].array
        around = [lp for lp in loops if all(inside(w.node, lp.body) for w in writes)]
        loop = around[-1] if around else None
        if (
            loop is None
            or not loop.counts_up_from_zero(src)
            or any(
                inside(w.node, inner.body)
                for inner in loops
                if inner.parent is loop
                for w in writes
            )
        ):
            raise Refuse("not_a_pass", f"{array} is not written by one pass over a range")
        starts = {_row_start(src, w, loop) for w in writes}
        if len(starts) != 1 or None in starts:
            raise Refuse("not_a_pass", f"{array} is not written at [start + j] by its pass")
        (start,) = starts
        assert start is not None and loop.bound is not None
        count = src.text(loop.bound)
        if not chunk:
            if loop.parent is None:
                raise Refuse(
                    "whole_array",
                    f"{array} is written by a loop over the whole array: stream it in chunks",
                )
            return src.insert_lines_after(loop.node, [f"{STREAM_CALL}({start}, {count});"])
        t0, tn = fresh(src, fn, "kf_c0"), fresh(src, fn, "kf_cn")
        inner, outer = _split_pragmas(src, loop)
        return [
            strip_mine(
                src,
                [loop],
                chunk,
                (t0, tn),
                inner=inner,
                pragma=outer,
                tail=[f"{STREAM_CALL}({start} + {t0}, {tn});"],
            )
        ]


def _row_start(src: CSource, write: Access, loop: Loop) -> str | None:
    """The pointer to the first element of what the pass writes, as C text."""
    node, var = write.node, loop.var
    array, index = node.child_by_field_name("argument"), node.child_by_field_name("index")
    if node.type != "subscript_expression" or array is None or index is None or var is None:
        return None
    base = {m: c for m, c in (write.index or {}).items() if m != (var,)}
    if write.index is None or write.index.get((var,)) != 1 or var in names_of(base):
        return None
    if names_of(base) & (assigned_names(src, loop.body) | src.declared_names(loop.node)):
        return None
    if index.type == "identifier":
        return src.text(array)
    operator = index.child_by_field_name("operator")
    left, right = index.child_by_field_name("left"), index.child_by_field_name("right")
    if index.type == "binary_expression" and operator is not None and src.text(operator) == "+":
        for mine, other in ((right, left), (left, right)):
            if mine is not None and other is not None and src.text(mine) == var:
                return f"{src.text(array)} + ({src.text(other)})"
    return f"{write.array} + ({poly_text(base)})"


def poly_text(p: Poly) -> str:
    terms = [" * ".join([str(c)] * (c != 1 or not m) + list(m)) for m, c in sorted(p.items())]
    return " + ".join(terms) or "0"


def _split_pragmas(src: CSource, loop: Loop) -> tuple[list[Edit], str]:
    """An `omp parallel for [simd]` of the pass: its thread clauses for the block loop, and
    the pass keeps `omp simd` with its vector clauses (or no pragma)."""
    for pragma in src.pragmas(loop.node):
        words, clauses = pragma_parts(" ".join(src.pragma_words(pragma)))
        if words[:3] != ["omp", "parallel", "for"]:
            continue
        outer = " ".join(["omp parallel for", *(c for c in clauses if c.startswith(_OUTER))])
        if "simd" not in words:
            return [Edit(pragma.start_byte, pragma.end_byte, "")], outer
        arg = pragma.child_by_field_name("argument")
        assert arg is not None
        simd = " ".join(["omp simd", *(c for c in clauses if c.startswith(_INNER))])
        return [Edit(arg.start_byte, arg.end_byte, simd)], outer
    return [], ""
