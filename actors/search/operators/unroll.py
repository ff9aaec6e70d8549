"""Unroll innermost loops: with `#pragma GCC unroll N`, or by hand, with N accumulators for
a reduction.

mode "pragma": `#pragma GCC unroll N` before each innermost loop that has no pragma (GCC
takes no unroll pragma on an `omp simd` loop; simdlen says it there).

mode "accumulators": each innermost loop that reduces into scalars (see
`dependence.reductions`) runs in steps of N with an array of N partial results per scalar:
the N statements of a step are independent, so the compiler vectorises them into N / width
vector accumulators (no -ffast-math needed: the partial sums are in the source), and the
adds no longer wait on each other. The partial results are combined in order after the
loop, and a remainder loop, the original, finishes the range.

Parameters: mode ("pragma", "accumulators"), factor (4, 2, 8, 16).
Refusals: no_loop, loop_has_pragma (every innermost loop has one), no_reduction, and the
dependence analysis' reasons.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from tree_sitter import Node

from actors.search.operators.base import Change, Job, SourceOperator
from actors.search.operators.c_ast import CSource, Edit, Loop, innermost
from actors.search.operators.dependence import Reduction, independence
from actors.search.operators.passes import INDENT, fresh, reindent
from actors.search.operators.protocol import ParamSpace, Refuse

_IDENTITY = {"+": "0", "*": "1"}


class Unroll(SourceOperator):
    name = "unroll"
    SPACE: ClassVar[ParamSpace] = {"mode": ("pragma", "accumulators"), "factor": (4, 2, 8, 16)}

    def change(self, job: Job) -> Change:
        src, params = job.src, job.params
        fn, loops = job.kernel()
        if not loops:
            raise Refuse("no_loop", "the kernel has no for loop")
        factor = int(params["factor"])
        plain = [lp for lp in innermost(loops) if not src.pragmas(lp.node)]
        if not plain:
            raise Refuse("loop_has_pragma", "every innermost loop has a pragma already")
        if params["mode"] == "pragma":
            edits = [
                e
                for lp in plain
                for e in src.insert_lines_before(lp.node, [f"#pragma GCC unroll {factor}"])
            ]
            return Change(tuple(edits), job.flags)
        names = (fresh(src, fn, "kf_j"), fresh(src, fn, "kf_k"))
        types = src.declared_types(fn)
        edits = []
        refused: list[Refuse] = []
        for loop in plain:
            try:
                found = independence(src, fn, loop, loops).reductions
                if found and _steppable(src, loop):
                    edits.append(_accumulate(src, fn, loop, found, factor, names, types))
            except Refuse as why:
                refused.append(why)
        if not edits:
            if refused:
                raise refused[0]
            raise Refuse("no_reduction", "no innermost loop reduces into a scalar")
        return Change(tuple(edits), job.flags)


def _steppable(src: CSource, loop: Loop) -> bool:
    """`for (T v = start; v < bound; ++v)`, not the remainder loop of an earlier unroll."""
    start = "" if loop.start is None else src.text(loop.start)
    return loop.declares_var and loop.op == "<" and loop.step == 1 and not start.startswith("kf_")


def _accumulate(
    src: CSource,
    fn: Node,
    loop: Loop,
    found: Sequence[Reduction],
    factor: int,
    names: tuple[str, str],
    types: dict[str, str],
) -> Edit:
    assert loop.var is not None and loop.start is not None and loop.bound is not None
    jj, k = names
    var, bound = loop.var, src.text(loop.bound)
    init = loop.node.child_by_field_name("initializer")
    counter = src.text(init.child_by_field_name("type") or init) if init is not None else "int64_t"
    accs = {r.var: fresh(src, fn, f"kf_acc_{r.var}") for r in found}
    for r in found:
        if types.get(r.var, "") in ("", "*") or types[r.var].endswith("*"):
            raise Refuse("unknown_type", f"the type of {r.var} is not known")
    body = loop.body
    renames = {r.var: f"{accs[r.var]}[{k}]" for r in found}
    step_body = src.rewritten(body, src.replace_identifiers(body, renames))
    indent = src.indent(loop.node)
    inits = " ".join(f"{accs[r.var]}[{k}] = {_IDENTITY.get(r.op, r.var)};" for r in found)
    combine = " ".join(_combine(r, f"{accs[r.var]}[{k}]") for r in found)
    each = f"for (int {k} = 0; {k} < {factor}; ++{k})"
    lines = [
        "{",
        *(f"{INDENT}{types[r.var]} {accs[r.var]}[{factor}];" for r in found),
        f"{INDENT}{each} {{ {inits} }}",
        f"{INDENT}{counter} {jj} = {src.text(loop.start)};",
        f"{INDENT}for (; {jj} + {factor} <= {bound}; {jj} += {factor}) {{",
        f"{INDENT * 2}{each} {{",
        f"{INDENT * 3}const {counter} {var} = {jj} + {k};",
        f"{INDENT * 3}" + reindent(step_body, INDENT * 3).lstrip(),
        f"{INDENT * 2}}}",
        f"{INDENT}}}",
        f"{INDENT}{each} {{ {combine} }}",
        f"{INDENT}for ({counter} {var} = {jj}; {var} < {bound}; ++{var}) "
        + reindent(src.text(body), INDENT).lstrip(),
        "}",
    ]
    text = lines[0] + "".join(f"\n{indent}{line}" for line in lines[1:])
    return Edit(loop.node.start_byte, loop.node.end_byte, text)


def _combine(r: Reduction, acc: str) -> str:
    if r.op in ("+", "*"):
        return f"{r.var} {r.op}= {acc};"
    compare = ">" if r.op == "max" else "<"
    return f"{r.var} = {acc} {compare} {r.var} ? {acc} : {r.var};"
