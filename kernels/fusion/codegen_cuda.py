"""CUDA C for the cuda target, generated from the same IR and lowering as the C.

Launch contract (also returned as data by `launches`):

- one `extern "C" __global__` kernel per group, `kf_group_<k>`, in partition order;
- arguments: device pointers to the group's inputs (problem inputs or the previous
  group's intermediate), then the destination, then `int64_t rows, int64_t cols`;
- grid: `min(rows, KF_MAX_GRID)` blocks of exactly `KF_BLOCK` threads, no dynamic
  shared memory; a block walks rows `blockIdx.x, blockIdx.x + gridDim.x, ...` and its
  threads stride over the columns of a row; a row reduction is a block reduction
  (warp shuffles, then one shared value per warp);
- intermediates: [rows, cols] float buffers, two used in turn as in the C back end.

The source also defines the host entry point with the problem's exact C signature
(`extern "C" void kernel(...)`, all pointers on the device): it allocates the
intermediates with cudaMalloc (256-byte aligned), launches the groups in order on the
default stream, and frees them (cudaFree waits for the work). If an allocation fails it
fills the output with NaN instead, so a failure is never a silently wrong answer. A
loader that only takes `__global__` functions (pycuda's SourceModule) can follow the
contract itself.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    stash_applies,
    tensor_param,
    value_name,
)
from kernels.fusion.partitions import Partition, parse_partition, partitions
from kernels.fusion.space import FUSION_SPACE_NAME, FusionSpace
from kernels.spec import Problem
from kernels.templates import Constraint, Param, Params, ParamValue, Rendered

MAX_GRID = 65535
DEFAULT_ARCH = "sm_90"
CUDA_FLAG_CHOICES: tuple[str, ...] = ("-O3", "-O3 --use_fast_math")


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a fused plan, in order."""

    kernel: str
    args: tuple[str, ...]
    """Problem argument names, intermediate buffer names (`kf_buf0`, ...) or dim names."""
    block: int
    grid: str
    """An expression over the dims: `min(rows, 65535)`."""
    shared_bytes: int = 0


PRELUDE = r"""#include <stdint.h>
#include <cuda_runtime.h>

/* 0.5 x (1 + tanh u) = x / (1 + exp(-2u)): no cancellation for x << 0, no overflow. */
static __device__ __forceinline__ float kf_gelu_tanh(float x) {
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

extern "C" __global__ void kf_fill_nan(float *y, int64_t n) {
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (int64_t)gridDim.x * blockDim.x)
        y[k] = __int_as_float(0x7fc00000);
}
"""


def _spell(program: GroupProgram) -> dict[str, str]:
    spelled: dict[str, str] = {}
    for t in program.inputs:
        p = tensor_param(t.name)
        if t.kind == MATRIX:
            spelled[t.name] = f"r_{p[2:]}[j]"
        elif t.kind == COLUMN:
            spelled[t.name] = f"{p}[j]"
        else:
            spelled[t.name] = f"{p}[i]"
    spelled[STASH] = "kf_dst_i[j]"
    return spelled


def _kernel(program: GroupProgram, unroll: int) -> list[str]:
    spelled = _spell(program)
    dims = {"rows": "rows", "cols": "cols"}

    def text(expr: object) -> str:
        return c_expr(expr, lambda n: spelled.get(n, value_name(n)), dims)  # type: ignore[arg-type]

    params = [f"const float *__restrict__ {tensor_param(t.name)}" for t in program.inputs]
    params += ["float *__restrict__ kf_dst", "int64_t rows", "int64_t cols"]
    lines = [
        f"/* group {program.index}: {' + '.join(program.ops)} */",
        f'extern "C" __global__ void __launch_bounds__(KF_BLOCK) kf_group_{program.index}(',
        f"    {', '.join(params)}) {{",
    ]
    if program.reductions:
        lines.append("    __shared__ float kf_red[32];")
    lines.append("    for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {")
    for t in program.inputs:
        if t.kind == MATRIX:
            p = tensor_param(t.name)
            lines.append(f"        const float *__restrict__ r_{p[2:]} = {p} + i * cols;")
    lines.append("        float *__restrict__ kf_dst_i = kf_dst + i * cols;")
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
        lines.append("        for (int64_t j = threadIdx.x; j < cols; j += KF_BLOCK) {")
        for let in statement.lets:
            lines.append(f"            const float {value_name(let.name)} = {text(let.expr)};")
        if isinstance(statement, ReduceLoop):
            if statement.stash is not None:
                lines.append(f"            kf_dst_i[j] = {value_name(statement.stash)};")
            lines.append(f"            {acc} += {text(statement.term)};")
            lines.append("        }")
            lines.append(f"        {acc} = kf_block_sum({acc}, kf_red);")
        else:
            assert isinstance(statement, StoreLoop)
            lines.append(f"            kf_dst_i[j] = {text(statement.value)};")
            lines.append("        }")
    lines += ["    }", "}", ""]
    return lines


def _buffers(programs: tuple[GroupProgram, ...]) -> list[str]:
    return [f"kf_buf{k}" for k in range(min(2, len(programs) - 1))]


def _launches(problem: Problem, programs: tuple[GroupProgram, ...], block: int) -> list[Launch]:
    rows, cols = problem.dims
    output = problem.outputs[0].name
    buffers = _buffers(programs)
    where: dict[str, str] = {a.name: a.name for a in problem.inputs}
    found: list[Launch] = []
    for program in programs:
        last = program.index == len(programs) - 1
        dest = output if last else buffers[program.index % 2]
        args = (*(where[t.name] for t in program.inputs), dest, rows, cols)
        found.append(Launch(f"kf_group_{program.index}", args, block, f"min({rows}, {MAX_GRID})"))
        where[program.output] = dest
    return found


def _entry(problem: Problem, programs: tuple[GroupProgram, ...], block: int) -> list[str]:
    rows, cols = problem.dims
    output = problem.outputs[0].name
    buffers = _buffers(programs)
    lines = [
        f'extern "C" {problem.c_signature()} {{',
        f"    if ({rows} <= 0 || {cols} <= 0) return;",
        f"    const unsigned int kf_grid = {rows} < KF_MAX_GRID ? (unsigned int){rows} "
        ": KF_MAX_GRID;",
    ]
    if buffers:
        lines.append(f"    const size_t kf_bytes = (size_t)({rows} * {cols}) * sizeof(float);")
        for b in buffers:
            lines += [
                f"    float *{b} = NULL;",
                f"    if (cudaMalloc((void **)&{b}, kf_bytes) != cudaSuccess) {b} = NULL;",
            ]
        failed = " || ".join(f"{b} == NULL" for b in buffers)
        lines += [
            f"    if ({failed}) {{",
            *[f"        if ({b} != NULL) cudaFree({b});" for b in buffers],
            "        /* no scratch memory: NaN everywhere, never a silently wrong answer */",
            f"        kf_fill_nan<<<kf_grid, KF_BLOCK>>>({output}, {rows} * {cols});",
            "        return;",
            "    }",
        ]
    for launch in _launches(problem, programs, block):
        lines.append(f"    {launch.kernel}<<<kf_grid, KF_BLOCK>>>({', '.join(launch.args)});")
    lines += [f"    cudaFree({b});" for b in buffers]
    lines += ["}", ""]
    return lines


def generate(
    problem: Problem,
    partition: Partition,
    *,
    block: int,
    unroll: int,
    reuse: str,
    graph: Graph | None = None,
) -> str:
    """The CUDA source of `problem` fused as `partition` (kernels and host entry)."""
    graph = graph or graph_of(problem)
    partition = parse_partition(partition, graph.op_names)
    programs = lower(graph, partition.groups, reuse)
    header = [
        f"/* Generated by kfactory fusion from the IR of {problem.name}. */",
        f"/* partition {partition.key}; block={block} unroll={unroll} reuse={reuse} */",
        PRELUDE,
        f"#define KF_BLOCK {block}",
        f"#define KF_MAX_GRID {MAX_GRID}",
        "",
    ]
    kernels = [line for p in programs for line in _kernel(p, unroll)]
    return "\n".join([*header, *kernels, *_entry(problem, programs, block)])


def launches(problem: Problem, partition: Partition, block: int) -> tuple[Launch, ...]:
    """The launches the host entry makes, in order: the contract for other loaders."""
    graph = graph_of(problem)
    partition = parse_partition(partition, graph.op_names)
    return tuple(_launches(problem, lower(graph, partition.groups), block))


def space(problem: Problem, arch: str = DEFAULT_ARCH) -> FusionSpace:
    """The cuda design space of a graph problem, compiled for `arch` (nvcc -arch)."""
    graph = graph_of(problem)
    keys = tuple(p.key for p in partitions(graph.op_names))
    stashable = frozenset(
        p.key for p in partitions(graph.op_names) if stash_applies(graph, p.groups)
    )
    params = (
        Param("partition", keys, "how the chain is split into kernels ('|' between kernels)"),
        Param("block", (128, 256, 512, 1024), "threads per block; one block per row at a time"),
        Param("unroll", (1, 2, 4), "#pragma unroll of the column loops"),
        Param(
            "reuse",
            REUSE_CHOICES,
            "a value needed before and after a row reduction: recompute it, or stash it "
            "in the output row",
        ),
        Param("flags", CUDA_FLAG_CHOICES, "nvcc flags"),
    )
    constraints = (
        Constraint(
            "stash only where a reduction reads a computed value",
            "reuse=stash changes nothing unless some group computes a value that a row "
            "reduction reads and a later loop reads again",
            lambda p: p["reuse"] != "stash" or str(p["partition"]) in stashable,
        ),
    )
    fused = keys[-1]
    defaults: dict[str, ParamValue] = {
        "partition": fused,
        "block": 256,
        "unroll": 2,
        "reuse": "recompute",
        "flags": "-O3",
    }

    def render(p: Params) -> Rendered:
        source = generate(
            problem,
            parse_partition(str(p["partition"]), graph.op_names),
            block=int(p["block"]),
            unroll=int(p["unroll"]),
            reuse=str(p["reuse"]),
            graph=graph,
        )
        return Rendered(source=source, flags=(*str(p["flags"]).split(), f"-arch={arch}"))

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
        generate=render,
    )
