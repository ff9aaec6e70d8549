"""C for the cpu target, generated from the IR: one function per group of a partition.

The entry point has the problem's exact C signature. It calls the group functions in
order; a value that crosses a group boundary lives in an intermediate [rows, cols]
buffer (two buffers, used in turn, serve any chain length), allocated with
`aligned_alloc` (64-byte aligned) and freed before return. If an allocation fails the
kernel writes NaN to every output element and returns: the verifier rejects NaN, so a
failure is never a silently wrong answer.

Each group function runs its rows in an OpenMP parallel loop (unless threads = 1) and,
per row, the loops of its lowered program (`kernels.fusion.lower`), each an `omp simd`
loop of simdlen(simdlen * unroll): `unroll` vectors per iteration, and as many partial
sums in a reduction (the convention of `kernels/cpu_templates`). The vector width is
also given to the compiler as -mprefer-vector-width. With streaming, each finished
output row is rewritten with non-temporal stores (as the hand-written templates do), so
it goes to memory without a read for ownership and leaves the cache to the inputs.

The same parameters always give the same bytes.
"""

from __future__ import annotations

from kernels.design_space import Param, Params, ParamValue, Rendered, compiler_flags, render_file
from kernels.fusion.ir import COLUMN, MATRIX, Graph, graph_of
from kernels.fusion.lower import (
    REUSE_CHOICES,
    STASH,
    GroupProgram,
    ReduceLoop,
    Scalar,
    StoreLoop,
    c_expr,
    lower,
    stash_constraint,
    tensor_param,
    value_name,
)
from kernels.fusion.partitions import Partition, parse_partition, partitions
from kernels.fusion.space import FUSION_SPACE_NAME, FusionSpace
from kernels.spec import Problem
from kernels.templates import FLAG_CHOICES, ROW_CONSTRAINTS

ALIGN = 64

PRELUDE = "\n".join(
    [
        "#include <stddef.h>",
        "#include <stdint.h>",
        "#include <stdlib.h>",
        "",
        render_file("cpu", "_math.c.j2"),
        "static inline float kf_rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }",
        "",
    ]
)
"""Includes and math helpers; kf_exp and kf_gelu are those of the cpu templates."""


STREAM_ROW = render_file("cpu", "_stream_row.c.j2")
"""Rewrites a finished row with non-temporal stores, then fences."""


def _spell(program: GroupProgram) -> dict[str, str]:
    """How each input of a group is read inside the per-row loops."""
    spelled: dict[str, str] = {}
    for t in program.inputs:
        if t.kind == MATRIX:
            spelled[t.name] = f"r_{tensor_param(t.name)[2:]}[j]"
        elif t.kind == COLUMN:
            spelled[t.name] = f"{tensor_param(t.name)}[j]"
        else:
            spelled[t.name] = f"{tensor_param(t.name)}[i]"
    spelled[STASH] = "kf_dst_i[j]"
    return spelled


def _group_function(program: GroupProgram, threads: int, streaming: bool) -> list[str]:
    spelled = _spell(program)
    dims = {"rows": "rows", "cols": "cols"}

    def expr_text(expr: object) -> str:
        return c_expr(expr, lambda n: spelled.get(n, value_name(n)), dims)  # type: ignore[arg-type]

    params = [f"const float *restrict {tensor_param(t.name)}" for t in program.inputs]
    params += ["float *restrict kf_dst", "int64_t rows", "int64_t cols"]
    lines = [
        f"/* group {program.index}: {' + '.join(program.ops)} */",
        f"static void kf_group_{program.index}({', '.join(params)}) {{",
    ]
    if threads != 1:
        clause = f" num_threads({threads})" if threads > 1 else ""
        lines.append(f"#pragma omp parallel for schedule(static){clause}")
    lines.append("    for (int64_t i = 0; i < rows; ++i) {")
    for t in program.inputs:
        if t.kind == MATRIX:
            p = tensor_param(t.name)
            lines.append(f"        const float *restrict r_{p[2:]} = {p} + i * cols;")
    lines.append("        float *restrict kf_dst_i = kf_dst + i * cols;")
    for statement in program.body:
        if isinstance(statement, Scalar):
            lines.append(
                f"        const float {value_name(statement.name)} = {expr_text(statement.expr)};"
            )
            continue
        if isinstance(statement, ReduceLoop):
            acc = value_name(statement.acc)
            lines.append(f"        float {acc} = 0.0f;")
            lines.append(f"#pragma omp simd simdlen(KF_W * KF_UNROLL) reduction(+:{acc})")
        else:
            lines.append("#pragma omp simd simdlen(KF_W * KF_UNROLL)")
        lines.append("        for (int64_t j = 0; j < cols; ++j) {")
        for let in statement.lets:
            lines.append(f"            const float {value_name(let.name)} = {expr_text(let.expr)};")
        if isinstance(statement, ReduceLoop):
            if statement.stash is not None:
                lines.append(f"            kf_dst_i[j] = {value_name(statement.stash)};")
            lines.append(f"            {acc} += {expr_text(statement.term)};")
        else:
            assert isinstance(statement, StoreLoop)
            lines.append(f"            kf_dst_i[j] = {expr_text(statement.value)};")
        lines.append("        }")
    if streaming:
        lines.append("        kf_stream_row(kf_dst_i, cols);")
    lines += ["    }", "}", ""]
    return lines


def _entry(problem: Problem, programs: tuple[GroupProgram, ...]) -> list[str]:
    output = problem.outputs[0].name
    rows, cols = problem.dims
    n_buffers = min(2, len(programs) - 1)
    buffers = [f"kf_buf{k}" for k in range(n_buffers)]
    where: dict[str, str] = {a.name: a.name for a in problem.inputs}
    lines = [f"{problem.c_signature()} {{"]
    if buffers:
        lines += [
            f"    /* {len(programs) - 1} intermediate(s) cross group boundaries; "
            f"{n_buffers} buffer(s) used in turn */",
            f"    const size_t kf_bytes = (((size_t)({rows} * {cols}) * sizeof(float)) "
            f"/ {ALIGN} + 1) * {ALIGN};",
        ]
        lines += [f"    float *{b} = (float *)aligned_alloc({ALIGN}, kf_bytes);" for b in buffers]
        failed = " || ".join(f"{b} == NULL" for b in buffers)
        lines += [
            f"    if ({failed}) {{",
            *[f"        free({b});" for b in buffers],
            "        /* no scratch memory: NaN everywhere, never a silently wrong answer */",
            f"        for (int64_t k = 0; k < {rows} * {cols}; ++k) {output}[k] = "
            '__builtin_nanf("");',
            "        return;",
            "    }",
        ]
    for program in programs:
        last = program.index == len(programs) - 1
        dest = output if last else buffers[program.index % 2]
        args = [where[t.name] for t in program.inputs] + [dest, rows, cols]
        lines.append(f"    kf_group_{program.index}({', '.join(args)});")
        where[program.output] = dest
    lines += [f"    free({b});" for b in buffers]
    lines += ["}", ""]
    return lines


def generate(
    problem: Problem,
    partition: Partition,
    *,
    threads: int,
    simdlen: int,
    streaming: bool,
    unroll: int,
    reuse: str,
    graph: Graph | None = None,
) -> str:
    """The C source of `problem` fused as `partition`."""
    graph = graph or graph_of(problem)
    programs = lower(graph, partition.groups, reuse)
    header = [
        f"/* Generated by kfactory fusion from the IR of {problem.name}. */",
        f"/* partition {partition.key}; threads={threads} simdlen={simdlen} "
        f"unroll={unroll} reuse={reuse} streaming={streaming} */",
        PRELUDE,
        f"#define KF_W {simdlen}",
        f"#define KF_UNROLL {unroll}",
        "",
        *([STREAM_ROW] if streaming else []),
    ]
    body = [line for p in programs for line in _group_function(p, threads, streaming)]
    return "\n".join([*header, *body, *_entry(problem, programs)])


def flags_for(params: Params) -> tuple[str, ...]:
    return (*compiler_flags("cpu", params), f"-mprefer-vector-width={int(params['simdlen']) * 32}")


def space(problem: Problem) -> FusionSpace:
    """The cpu design space of a graph problem: the partition and the code-generation knobs."""
    graph = graph_of(problem)
    keys = tuple(p.key for p in partitions(graph.op_names))
    only_where_stash_applies = stash_constraint(graph)
    params = (
        Param("partition", keys, "how the chain is split into kernels ('|' between kernels)"),
        Param("threads", (0, 1, 2), "OpenMP threads over rows; 0 = all cores"),
        Param("simdlen", (8, 16), "floats per vector (omp simd simdlen, preferred width)"),
        Param("unroll", (1, 2, 4), "vectors per loop iteration (and partial sums)"),
        Param(
            "reuse",
            REUSE_CHOICES,
            "a value needed before and after a row reduction: recompute it, or stash it "
            "in the output row",
        ),
        Param(
            "streaming",
            (False, True),
            "after computing a row, rewrite it with non-temporal stores (no read for "
            "ownership, the row leaves the cache)",
        ),
        Param("flags", FLAG_CHOICES, "compiler flags"),
    )
    constraints = (
        ROW_CONSTRAINTS[0],
        only_where_stash_applies,
    )
    fused = keys[-1]
    defaults: dict[str, ParamValue] = {
        "partition": fused,
        "threads": 0,
        "simdlen": 16,
        "unroll": 2,
        "reuse": "recompute",
        "streaming": False,
        "flags": "-O3 -march=native",
    }
    best: dict[str, ParamValue] = {
        **defaults,
        "reuse": "stash"
        if only_where_stash_applies.holds({"reuse": "stash", "partition": fused})
        else "recompute",
    }

    def render(p: Params, dtype: str = "fp32") -> Rendered:
        source = generate(
            problem,
            parse_partition(str(p["partition"]), graph.op_names),
            threads=int(p["threads"]),
            streaming=bool(p["streaming"]),
            simdlen=int(p["simdlen"]),
            unroll=int(p["unroll"]),
            reuse=str(p["reuse"]),
            graph=graph,
        )
        return Rendered(source=source, flags=flags_for(p))

    return FusionSpace(
        name=FUSION_SPACE_NAME,
        problem=problem.name,
        target="cpu",
        file="",
        algorithm="generated from the op IR: one C function per group, intermediates in "
        "aligned buffers between groups",
        params=params,
        constraints=constraints,
        defaults=defaults,
        best_known=best,
        graph=graph,
        generator=render,
    )
