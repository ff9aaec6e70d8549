"""Parallelize the outermost independent loop of each loop nest with OpenMP.

In each top-level loop nest of the kernel, the outermost loop that `dependence.independence`
proves independent (in a row-wise kernel, the loop over rows; below a loop that is not, only
into the one loop nest it holds, never into several sibling passes) gets `#pragma omp parallel
for` with the point's schedule, chunk and thread count, a `reduction` clause for each
scalar it reduces into and `private` for inner counters declared outside it; where that loop
is already an `omp simd` loop, its pragma becomes `omp parallel for simd`. The child is
built with -fopenmp.

Parameters: threads (0: the runtime's default, all cores), schedule, chunk (0: none).
A loop that sums floats into a scalar is refused (nondeterministic_reduction): threads add
their partial sums in whatever order they finish, so runs differ, and the verifier rejects
a kernel whose runs disagree. Apply it before the operators that strip-mine a 1-D loop
(tile, nontemporal with a chunk): their block loops are not proven independent.

Refusals: already_parallel, no_loop, loop_has_pragma, nondeterministic_reduction, and the
dependence analysis' reasons for the outermost loop (carried_dependence, scalar_dependence,
opaque_call, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from tree_sitter import Node

from actors.search.operators.base import Change, Job, SourceOperator, openmp_flags
from actors.search.operators.c_ast import FLOAT_TYPES, CSource, Edit, Loop, named_descendants
from actors.search.operators.dependence import Independence, independence, reduction_clauses
from actors.search.operators.protocol import ParamSpace, Refuse


def is_parallel(words: list[str]) -> bool:
    return words[:2] in (["omp", "parallel"], ["omp", "for"])


def outermost_independent(
    src: CSource, fn: Node, loops: Sequence[Loop]
) -> tuple[list[Independence], list[Refuse]]:
    """Per loop nest, its outermost independent loops; and why the loops above them are not."""
    found: list[Independence] = []
    refused: list[Refuse] = []
    types = src.declared_types(fn)
    frontier = [lp for lp in loops if lp.parent is None]
    while frontier:
        below: list[Loop] = []
        for loop in frontier:
            try:
                ind = independence(src, fn, loop, loops)
                sums = [
                    r.var
                    for r in ind.reductions
                    if r.op in "+*" and types.get(r.var) in FLOAT_TYPES
                ]
                if sums:
                    line = loop.node.start_point.row + 1
                    raise Refuse(
                        "nondeterministic_reduction",
                        f"line {line}: threads would sum {', '.join(sums)} in an order that "
                        "changes from run to run",
                    )
                found.append(ind)
            except Refuse as why:
                refused.append(why)
                nested = [lp for lp in loops if lp.parent is loop]
                below += nested if len(nested) == 1 else []
        frontier = below
    return found, refused


class OmpParallel(SourceOperator):
    name = "omp_parallel"
    SPACE: ClassVar[ParamSpace] = {
        "threads": (0, 2, 4, 8),
        "schedule": ("static", "dynamic", "guided"),
        "chunk": (0, 1, 16, 256),
    }

    def change(self, job: Job) -> Change:
        src, params = job.src, job.params
        fn = src.kernel()
        if any(is_parallel(src.pragma_words(p)) for p in named_descendants(fn, "preproc_call")):
            raise Refuse("already_parallel", "the kernel already has an omp parallel region")
        loops = src.loops(src.body(fn))
        if not loops:
            raise Refuse("no_loop", "the kernel has no for loop")
        found, refused = outermost_independent(src, fn, loops)
        if not found:
            raise refused[0]
        chunk = f", {params['chunk']}" if params["chunk"] else ""
        clauses = [f"schedule({params['schedule']}{chunk})"]
        if params["threads"]:
            clauses.append(f"num_threads({params['threads']})")
        edits: list[Edit] = []
        for ind in found:
            edits += self._pragma(src, ind, clauses)
        return Change(tuple(edits), openmp_flags(job.flags, threads=True))

    def _pragma(self, src: CSource, ind: Independence, clauses: list[str]) -> list[Edit]:
        pragmas = src.pragmas(ind.loop.node)
        private = [f"private({', '.join(ind.private)})"] if ind.private else []
        if not pragmas:
            words = ["omp parallel for", *clauses, *reduction_clauses(ind.reductions), *private]
            return src.insert_lines_before(ind.loop.node, ["#pragma " + " ".join(words)])
        if len(pragmas) == 1 and src.pragma_words(pragmas[0])[:2] == ["omp", "simd"]:
            return [
                src.pragma_edit(pragmas[0], 0, " parallel for"),
                src.pragma_edit(pragmas[0], -1, "".join(f" {c}" for c in clauses + private)),
            ]
        line = ind.loop.node.start_point.row + 1
        raise Refuse("loop_has_pragma", f"line {line}: the loop has pragmas of its own")
