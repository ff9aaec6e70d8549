"""CUDA templates for the row-wise problems (softmax, rmsnorm, layernorm), gelu and KDA.

Row kernels give each row a group of `block / rows_per_block` threads (whole warps); 16-byte
vector paths run only where cols is a multiple of the vector and the pointers are aligned,
and fall back to scalar code otherwise, so every point is correct at every shape.
"""

from __future__ import annotations

from kernels.design_space import CUDA_FLAGS, Constraint, Param, Params, ParamValue, Template


def _threads_per_row(p: Params) -> int:
    return int(p["block"]) // int(p["rows_per_block"])


ROW_PARAMS: tuple[Param, ...] = (
    Param("block", (128, 256, 512), "threads per block"),
    Param(
        "rows_per_block",
        (1, 4),
        "rows a block works on at once; each row gets block / rows_per_block threads",
    ),
    Param(
        "vector",
        ("scalar", "vec16"),
        "16-byte loads and stores (4 floats, 8 halves) where cols is a multiple of the vector "
        "and the pointers are aligned, scalar code otherwise; or scalar code always",
    ),
    Param(
        "reduction",
        ("warp", "shared"),
        "row reductions by warp shuffles and one value per warp, or by a shared-memory tree",
    ),
    Param(
        "row_cache",
        ("none", "registers", "shared"),
        "where the row waits between passes: re-read from global memory; registers "
        "(32 floats per thread with vectors, 16 without); shared memory (32 KiB per block); "
        "rows too long for the cache are re-read",
    ),
)

ROW_CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint(
        "a shared-memory tree needs eight warps per row",
        "with fewer than 256 threads per row the tree is mostly idle levels; use shuffles",
        lambda p: p["reduction"] == "warp" or _threads_per_row(p) >= 256,
    ),
    Constraint(
        "several rows per block only for short rows",
        "rows_per_block > 1 is for rows given one or two warps; a 128-thread row in a "
        "512-thread block is the 128-thread block with coarser scheduling",
        lambda p: int(p["rows_per_block"]) == 1 or _threads_per_row(p) <= 64,
    ),
)


def _multi_pass_needs_cache(one_pass: str) -> Constraint:
    return Constraint(
        "multi-pass statistics read a cached row",
        f"without a row cache every extra pass re-reads global memory; {one_pass} reads it once",
        lambda p: p["stats"] == one_pass or p["row_cache"] != "none",
    )


def _row_template(
    name: str,
    problem: str,
    file: str,
    algorithm: str,
    stats: Param | None,
    best: dict[str, ParamValue],
) -> Template:
    params = (*ROW_PARAMS, *(() if stats is None else (stats,)), Param("flags", CUDA_FLAGS, "nvcc"))
    constraints = ROW_CONSTRAINTS
    defaults: dict[str, ParamValue] = {
        "block": 256,
        "rows_per_block": 1,
        "vector": "vec16",
        "reduction": "warp",
        "row_cache": "none",
        "flags": "-O3",
    }
    if stats is not None:
        constraints = (*constraints, _multi_pass_needs_cache(str(stats.choices[0])))
        defaults["stats"] = stats.choices[0]
    return Template(
        name=name,
        problem=problem,
        target="cuda",
        file=file,
        algorithm=algorithm,
        params=params,
        constraints=constraints,
        defaults=defaults,
        best_known=best,
    )


# Best guesses for 8192 x 8192 bf16 on H100/H200: a 256-thread block per row holds 8192
# columns in registers (32 floats per thread), 16-byte vectors, shuffle reductions.
_ROW_BEST: dict[str, ParamValue] = {
    "block": 256,
    "rows_per_block": 1,
    "vector": "vec16",
    "reduction": "warp",
    "row_cache": "registers",
}

SOFTMAX_ROWS = _row_template(
    "softmax_cuda_rows",
    "softmax",
    "softmax.cu.j2",
    "a thread group per row: max and sum of exp (online or max-then-sum), then a scaled exp pass",
    Param(
        "stats",
        ("online", "max_then_sum"),
        "one read of the row and one reduction of (max, sum of exp) pairs, rescaled per chunk "
        "when the row is not cached; or a max reduction, then a sum of exp reduction",
    ),
    {**_ROW_BEST, "stats": "online", "flags": "-O3 --use_fast_math"},
)

RMSNORM_ROWS = _row_template(
    "rmsnorm_cuda_rows",
    "rmsnorm",
    "rmsnorm.cu.j2",
    "a thread group per row: sum of squares, then a scale-and-weight pass",
    None,
    {**_ROW_BEST, "flags": "-O3 --use_fast_math"},
)

LAYERNORM_ROWS = _row_template(
    "layernorm_cuda_rows",
    "layernorm",
    "layernorm.cu.j2",
    "a thread group per row: mean and variance (Welford or two passes), then an affine pass",
    Param(
        "stats",
        ("welford", "two_pass"),
        "one pass merging (count, mean, M2) summaries, or a mean pass then a variance pass",
    ),
    {**_ROW_BEST, "stats": "welford", "flags": "-O3 --use_fast_math"},
)

GELU_STREAM = Template(
    name="gelu_cuda_stream",
    problem="gelu",
    target="cuda",
    file="gelu.cu.j2",
    algorithm="elementwise x / (1 + exp(-2u)); each thread loads `items` chunks, then stores them",
    params=(
        Param("block", (128, 256, 512, 1024), "threads per block"),
        Param("items", (1, 2, 4, 8), "chunks (vectors or elements) per thread per tile"),
        Param(
            "vector",
            ("scalar", "vec16"),
            "16-byte chunks where the pointers are aligned (the last partial chunk is scalar), "
            "or one element per chunk",
        ),
        Param(
            "grid",
            ("cover", "stride"),
            "one block per tile, or one block per 8 tiles, striding over them (an eighth "
            "of the blocks, each living longer)",
        ),
        Param("flags", CUDA_FLAGS, "nvcc"),
    ),
    constraints=(
        Constraint(
            "a thread's 16-byte chunks fit its registers",
            "1024-thread blocks get 64 registers a thread: 8 chunks of 8 bf16 (64 floats) spill",
            lambda p: p["vector"] == "scalar" or int(p["block"]) * int(p["items"]) <= 4096,
        ),
    ),
    defaults={"block": 256, "items": 1, "vector": "vec16", "grid": "cover", "flags": "-O3"},
    best_known={
        "block": 256,
        "items": 4,
        "vector": "vec16",
        "grid": "cover",
        "flags": "-O3 --use_fast_math",
    },
)


def _register_slots_cover_keys(p: Params) -> bool:
    return p["state"] != "registers" or int(p["k_lanes"]) * int(p["keys_per_lane"]) in (64, 128)


KDA_RECURRENT = Template(
    name="kda_cuda_recurrent",
    problem="kda",
    target="cuda",
    file="kda_recurrent.cu.j2",
    algorithm=(
        "per (batch, head, tile of value columns) a block; k_lanes lanes share each column's "
        "K-vector of state, reduce k.S and q.S by shuffles, T steps in order"
    ),
    params=(
        Param("block", (64, 128, 256), "threads per block (block / k_lanes value columns)"),
        Param("k_lanes", (4, 8, 16, 32), "lanes splitting the K keys of one value column"),
        Param(
            "keys_per_lane",
            (2, 4, 8, 16),
            "state entries per lane held in registers; keys beyond k_lanes * keys_per_lane "
            "live in shared memory",
        ),
        Param(
            "state",
            ("registers", "shared"),
            "the state column in registers (spilling to shared memory past the register slots) "
            "or all of it in shared memory (48 KiB: K <= 12288 * k_lanes / block)",
        ),
        Param("prefetch", (False, True), "load step t+1's q, k, g, v, beta during step t"),
        Param("flags", CUDA_FLAGS, "nvcc"),
    ),
    constraints=(
        Constraint(
            "register slots cover 64 or 128 keys",
            "with register state, k_lanes * keys_per_lane is 64 or 128 (the usual head sizes)",
            _register_slots_cover_keys,
        ),
        Constraint(
            "keys_per_lane is unused with shared state",
            "shared state keeps no register slots; keys_per_lane stays at its smallest choice",
            lambda p: p["state"] == "registers" or int(p["keys_per_lane"]) == 2,
        ),
    ),
    defaults={
        "block": 128,
        "k_lanes": 32,
        "keys_per_lane": 2,
        "state": "registers",
        "prefetch": False,
        "flags": "-O3",
    },
    best_known={
        "block": 64,
        "k_lanes": 16,
        "keys_per_lane": 4,
        "state": "registers",
        "prefetch": True,
        "flags": "-O3 --use_fast_math",
    },
)

ROW_TEMPLATES: tuple[Template, ...] = (
    SOFTMAX_ROWS,
    RMSNORM_ROWS,
    LAYERNORM_ROWS,
    GELU_STREAM,
    KDA_RECURRENT,
)
