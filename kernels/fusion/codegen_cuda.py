"""CUDA C for the cuda target, generated from the same IR and lowering as the C.

The source holds device code only; how to run it is declared in it with the
`// kf-buffer:` and `// kf-launch:` lines of `kernels.cuda_launch` (also returned as a
`LaunchPlan` by `launch_plan`):

- one `extern "C" __global__` kernel per group, `kf_group_<k>`, launched in partition
  order on one stream;
- arguments: device pointers to the group's inputs (problem inputs or the previous
  group's intermediate), then the destination, then (see below) a stash buffer, then
  `int64_t rows, int64_t cols`;
- grid: `min(rows, 65535)` blocks of exactly `block` threads, no dynamic shared memory;
  a block walks rows `blockIdx.x, blockIdx.x + gridDim.x, ...` and its threads stride
  over the columns of a row; a row reduction is a block reduction (warp shuffles, then
  one shared value per warp);
- problem arguments are in the campaign's dtype (`kf_t`); all math is fp32, and the
  intermediates are [rows, cols] fp32 buffers (`kf_buf0`, `kf_buf1`, used in turn as in
  the C back end);
- reuse="stash" writes the stashed value into the destination row when that row is
  fp32; a 16-bit output would round it (or overflow, in fp16), so the last group stashes
  into its own fp32 buffer `kf_stash` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.cuda_launch import Launch, LaunchPlan, buffer, launch
from kernels.design_space import (
    CUDA_FLAGS,
    CUDA_TYPES,
    Param,
    Params,
    ParamValue,
    Rendered,
    compiler_flags,
)
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

MAX_GRID = 65535
STASH_BUFFER = "kf_stash"
ELEMENT = "kf_t"
"""The C type of problem arguments (the campaign's dtype); intermediates are float."""


PRELUDE = r"""#include <stdint.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

static __device__ __forceinline__ float kf_to_float(float v) { return v; }
static __device__ __forceinline__ float kf_to_float(__half v) { return __half2float(v); }
static __device__ __forceinline__ float kf_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
static __device__ __forceinline__ void kf_store(float *p, float v) { *p = v; }
static __device__ __forceinline__ void kf_store(__half *p, float v) { *p = __float2half_rn(v); }
static __device__ __forceinline__ void kf_store(__nv_bfloat16 *p, float v) {
    *p = __float2bfloat16_rn(v);
}

/* 0.5 x (1 + tanh u) = x / (1 + exp(-2u)): no cancellation for x << 0, no overflow. */
static __device__ __forceinline__ float kf_gelu(float x) {
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
}

static __device__ __forceinline__ float kf_rsqrt(float x) { return rsqrtf(x); }

/* The sum of v over the block, returned to every thread; `shared` holds 32 floats. */
static __device__ __forceinline__ float kf_block_sum(float v, float *shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? shared[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) shared[0] = v;
    }
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}
"""


@dataclass(frozen=True)
class _Wiring:
    """Where one group reads and writes: argument names and their element types."""

    inputs: tuple[tuple[str, str], ...]
    """(argument, element type) per input of the group, in `program.inputs` order."""
    dest: str
    dest_type: str
    stash: str | None
    """The argument the group stashes into when it is not the destination."""


def _wiring(
    problem: Problem, programs: tuple[GroupProgram, ...], dtype: str
) -> tuple[_Wiring, ...]:
    output = problem.outputs[0].name
    buffers = _buffers(programs)
    where: dict[str, tuple[str, str]] = {a.name: (a.name, ELEMENT) for a in problem.inputs}
    wired: list[_Wiring] = []
    for program in programs:
        last = program.index == len(programs) - 1
        dest, dest_type = (output, ELEMENT) if last else (buffers[program.index % 2], "float")
        stash = STASH_BUFFER if _stashes_apart(program, last, dtype) else None
        wired.append(_Wiring(tuple(where[t.name] for t in program.inputs), dest, dest_type, stash))
        where[program.output] = (dest, dest_type)
    return tuple(wired)


def _stashes_apart(program: GroupProgram, last: bool, dtype: str) -> bool:
    return program.stashes and last and dtype != "fp32"


def _buffers(programs: tuple[GroupProgram, ...]) -> list[str]:
    return [f"kf_buf{k}" for k in range(min(2, len(programs) - 1))]


def _read(pointer: str, element: str) -> str:
    return f"kf_to_float({pointer})" if element == ELEMENT else pointer


def _kernel(program: GroupProgram, wiring: _Wiring, unroll: int) -> list[str]:
    stash_row = "kf_stash_i" if wiring.stash else "kf_dst_i"
    stash_type = "float" if wiring.stash else wiring.dest_type
    spelled: dict[str, str] = {}
    for t, (_, element) in zip(program.inputs, wiring.inputs, strict=True):
        p = tensor_param(t.name)
        index = (
            f"r_{p[2:]}[j]" if t.kind == MATRIX else (f"{p}[j]" if t.kind == COLUMN else f"{p}[i]")
        )
        spelled[t.name] = _read(index, element)
    spelled[STASH] = _read(f"{stash_row}[j]", stash_type)
    dims = {"rows": "rows", "cols": "cols"}

    def text(expr: object) -> str:
        return c_expr(expr, lambda n: spelled.get(n, value_name(n)), dims)  # type: ignore[arg-type]

    def store(row: str, element: str, value: str) -> str:
        if element == ELEMENT:
            return f"kf_store(&{row}[j], {value});"
        return f"{row}[j] = {value};"

    params = [
        f"const {element} *__restrict__ {tensor_param(t.name)}"
        for t, (_, element) in zip(program.inputs, wiring.inputs, strict=True)
    ]
    params.append(f"{wiring.dest_type} *__restrict__ kf_dst")
    if wiring.stash:
        params.append(f"float *__restrict__ {wiring.stash}")
    params += ["int64_t rows", "int64_t cols"]
    lines = [
        f"/* group {program.index}: {' + '.join(program.ops)} */",
        f'extern "C" __global__ void __launch_bounds__(kf_block) kf_group_{program.index}(',
        f"    {', '.join(params)}) {{",
    ]
    if program.reductions:
        lines.append("    __shared__ float kf_red[32];")
    lines.append("    for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {")
    for t, (_, element) in zip(program.inputs, wiring.inputs, strict=True):
        if t.kind == MATRIX:
            p = tensor_param(t.name)
            lines.append(f"        const {element} *__restrict__ r_{p[2:]} = {p} + i * cols;")
    lines.append(f"        {wiring.dest_type} *__restrict__ kf_dst_i = kf_dst + i * cols;")
    if wiring.stash:
        lines.append(f"        float *__restrict__ kf_stash_i = {wiring.stash} + i * cols;")
    for statement in program.body:
        if isinstance(statement, Scalar):
            lines.append(
                f"        const float {value_name(statement.name)} = {text(statement.expr)};"
            )
            continue
        if isinstance(statement, ReduceLoop):
            acc = value_name(statement.acc)
            lines.append(f"        float {acc} = 0.0f;")
        lines.append(f"#pragma unroll {unroll}")
        lines.append("        for (int64_t j = threadIdx.x; j < cols; j += kf_block) {")
        for let in statement.lets:
            lines.append(f"            const float {value_name(let.name)} = {text(let.expr)};")
        if isinstance(statement, ReduceLoop):
            if statement.stash is not None:
                value = value_name(statement.stash)
                lines.append(f"            {store(stash_row, stash_type, value)}")
            lines.append(f"            {acc} += {text(statement.term)};")
            lines.append("        }")
            lines.append(f"        {acc} = kf_block_sum({acc}, kf_red);")
        else:
            assert isinstance(statement, StoreLoop)
            value = text(statement.value)
            lines.append(f"            {store('kf_dst_i', wiring.dest_type, value)}")
            lines.append("        }")
    lines += ["    }", "}", ""]
    return lines


def _plan(
    problem: Problem, programs: tuple[GroupProgram, ...], block: int, dtype: str
) -> LaunchPlan:
    rows, cols = problem.dims
    nbytes = f"4 * {rows} * {cols}"
    wired = _wiring(problem, programs, dtype)
    buffers = [buffer(b, nbytes) for b in _buffers(programs)]
    if any(w.stash for w in wired):
        buffers.append(buffer(STASH_BUFFER, nbytes))
    launches: list[Launch] = []
    for program, w in zip(programs, wired, strict=True):
        args = (*(arg for arg, _ in w.inputs), w.dest, *([w.stash] if w.stash else []), rows, cols)
        launches.append(
            launch(f"kf_group_{program.index}", args, f"min({rows}, {MAX_GRID})", block)
        )
    return LaunchPlan(tuple(buffers), tuple(launches))


def generate(
    problem: Problem,
    partition: Partition,
    *,
    block: int,
    unroll: int,
    reuse: str,
    dtype: str = "fp32",
    graph: Graph | None = None,
) -> str:
    """The CUDA source of `problem` fused as `partition`, for elements of `dtype`."""
    graph = graph or graph_of(problem)
    programs = lower(graph, partition.groups, reuse)
    wired = _wiring(problem, programs, dtype)
    header = [
        f"/* Generated by kfactory fusion from the IR of {problem.name}, {dtype} elements. */",
        f"/* partition {partition.key}; block={block} unroll={unroll} reuse={reuse} */",
        _plan(problem, programs, block, dtype).render(),
        PRELUDE,
        f"typedef {CUDA_TYPES[dtype]} {ELEMENT};",
        f"constexpr int kf_block = {block};",
        "",
    ]
    kernels = [line for p, w in zip(programs, wired, strict=True) for line in _kernel(p, w, unroll)]
    return "\n".join([*header, *kernels])


def launch_plan(
    problem: Problem, partition: Partition, block: int, reuse: str, dtype: str = "fp32"
) -> LaunchPlan:
    """The buffers and launches the source of this point declares, as data."""
    return _plan(problem, lower(graph_of(problem), partition.groups, reuse), block, dtype)


def space(problem: Problem) -> FusionSpace:
    """The cuda design space of a graph problem. Its sources do not depend on the GPU's
    architecture (the back end adds nvcc's -arch)."""
    graph = graph_of(problem)
    keys = tuple(p.key for p in partitions(graph.op_names))
    only_where_stash_applies = stash_constraint(graph)
    params = (
        Param("partition", keys, "how the chain is split into kernels ('|' between kernels)"),
        Param("block", (128, 256, 512, 1024), "threads per block; one block per row at a time"),
        Param("unroll", (1, 2, 4), "#pragma unroll of the column loops"),
        Param(
            "reuse",
            REUSE_CHOICES,
            "a value needed before and after a row reduction: recompute it, or stash it "
            "in fp32 memory (the output row when it is fp32)",
        ),
        Param("flags", CUDA_FLAGS, "nvcc flags"),
    )
    constraints = (only_where_stash_applies,)
    fused = keys[-1]
    defaults: dict[str, ParamValue] = {
        "partition": fused,
        "block": 256,
        "unroll": 2,
        "reuse": "recompute",
        "flags": "-O3",
    }

    def render(p: Params, dtype: str = "fp32") -> Rendered:
        source = generate(
            problem,
            parse_partition(str(p["partition"]), graph.op_names),
            block=int(p["block"]),
            unroll=int(p["unroll"]),
            reuse=str(p["reuse"]),
            dtype=dtype,
            graph=graph,
        )
        return Rendered(source=source, flags=compiler_flags("cuda", p))

    return FusionSpace(
        name=FUSION_SPACE_NAME,
        problem=problem.name,
        target="cuda",
        file="",
        algorithm="generated from the op IR: one __global__ kernel per group, a block per row",
        params=params,
        constraints=constraints,
        defaults=defaults,
        best_known=dict(defaults),
        graph=graph,
        generator=render,
    )
