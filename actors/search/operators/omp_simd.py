"""`#pragma omp simd` on the kernel's innermost loops, with `reduction` clauses where a loop
reduces.

Every innermost loop of the kernel that `dependence.independence` proves free of carried
dependences gets `#pragma omp simd` (with `simdlen(N)` when asked, and a reduction clause
for each scalar it reduces into); a loop that is already `omp parallel for` becomes `omp
parallel for simd`. With `minmax = "select"`, a max or min reduction written with
fmaxf/fminf, or as `if (e > m) m = e;`, is rewritten as `m = e > m ? e : m` (or <), which
the compiler vectorises (x86's MAXPS) and fmaxf it does not without -ffinite-math-only:
the two agree wherever the running value starts as a number, since a NaN element never
replaces it in either. The
child is built with -fopenmp-simd (or the -fopenmp it has).

Parameters: simdlen (0: the compiler's), minmax ("keep", "select").
Refusals: no_loop, already_simd (every innermost loop is), loop_has_pragma, and the
dependence analysis' reasons (carried_dependence, opaque_call, ...) when no loop qualifies.
"""

from __future__ import annotations

from typing import ClassVar

from tree_sitter import Node

from actors.search.operators.base import Change, Job, SourceOperator, openmp_flags
from actors.search.operators.c_ast import CSource, Edit, innermost
from actors.search.operators.dependence import (
    Independence,
    Reduction,
    guard_of,
    independence,
    reduction_clauses,
)
from actors.search.operators.omp_parallel import is_parallel
from actors.search.operators.protocol import ParamSpace, Refuse

_SELECT = {"max": ">", "min": "<"}


class OmpSimd(SourceOperator):
    name = "omp_simd"
    SPACE: ClassVar[ParamSpace] = {"simdlen": (0, 4, 8, 16), "minmax": ("keep", "select")}

    def change(self, job: Job) -> Change:
        src, params = job.src, job.params
        fn, loops = job.kernel()
        if not loops:
            raise Refuse("no_loop", "the kernel has no for loop")
        edits: list[Edit] = []
        refused: list[Refuse] = []
        simdlen = f" simdlen({params['simdlen']})" if params["simdlen"] else ""
        for loop in innermost(loops):
            if any("simd" in src.pragma_words(p) for p in src.pragmas(loop.node)):
                continue
            try:
                ind = independence(src, fn, loop, loops)
                edits += self._pragma(src, ind, simdlen)
            except Refuse as why:
                refused.append(why)
                continue
            if params["minmax"] == "select":
                edits += [e for r in ind.reductions for e in _as_select(src, r)]
        if not edits:
            if refused:
                raise refused[0]
            raise Refuse("already_simd", "every innermost loop is an omp simd loop already")
        return Change(tuple(edits), openmp_flags(job.flags, threads=False))

    def _pragma(self, src: CSource, ind: Independence, simdlen: str) -> list[Edit]:
        pragmas = src.pragmas(ind.loop.node)
        if not pragmas:
            words = ["omp simd" + simdlen, *reduction_clauses(ind.reductions)]
            return src.insert_lines_before(ind.loop.node, ["#pragma " + " ".join(words)])
        words = src.pragma_words(pragmas[0])
        if len(pragmas) == 1 and is_parallel(words) and "for" in words:
            return [
                src.pragma_edit(pragmas[0], words.index("for"), " simd"),
                src.pragma_edit(pragmas[0], -1, simdlen),
            ]
        line = ind.loop.node.start_point.row + 1
        raise Refuse("loop_has_pragma", f"line {line}: the loop has pragmas of its own")


def _as_select(src: CSource, reduction: Reduction) -> list[Edit]:
    """`m = fmaxf(m, e)` and `if (e > m) m = e;` as `m = e > m ? e : m` (and min with <)."""
    edits: list[Edit] = []
    for assign in reduction.statements:
        right = assign.child_by_field_name("right")
        guard = guard_of(assign)
        if guard is not None and right is not None and reduction.op in _SELECT:
            e, m = _operand(src, right), reduction.var
            select = f"{m} = {e} {_SELECT[reduction.op]} {m} ? {e} : {m};"
            edits.append(Edit(guard.start_byte, guard.end_byte, select))
            continue
        if right is None or right.type != "call_expression" or reduction.op not in _SELECT:
            continue
        args = right.child_by_field_name("arguments")
        assert args is not None
        other = [a for a in args.named_children if src.text(a) != reduction.var]
        if len(other) != 1:
            continue
        e = _operand(src, other[0])
        m = reduction.var
        edits.append(
            Edit(right.start_byte, right.end_byte, f"{e} {_SELECT[reduction.op]} {m} ? {e} : {m}")
        )
    return edits


def _operand(src: CSource, node: Node) -> str:
    text = src.text(node)
    simple = node.type in (
        "identifier",
        "subscript_expression",
        "number_literal",
        "call_expression",
    )
    return text if simple or node.type == "parenthesized_expression" else f"({text})"
