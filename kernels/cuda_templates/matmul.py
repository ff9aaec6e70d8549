"""CUDA templates for matmul: a SIMT register-blocked kernel and a tensor-core (wmma) one.

Both compute C = A @ B for row-major A [M, K], B [K, N], C [M, N] of any sizes (1 and odd
ones included: loads past an edge read zeros, stores past an edge are skipped), reading
and writing the campaign's dtype and accumulating in fp32. Shared memory is static and at
most 48 KiB, so the loader needs no opt-in attribute.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.design_space import CUDA_FLAGS, Constraint, Param, Params, Template

STATIC_SMEM_LIMIT = 48 * 1024


@dataclass(frozen=True)
class DtypeTemplate(Template):
    """A template written for only some of its target's dtypes: `render` refuses the rest."""

    dtypes: tuple[str, ...] = ()

    def accepts(self, dtype: str) -> bool:
        return dtype in self.dtypes and super().accepts(dtype)


# SIMT: shared-memory tiles, a register tile per thread ---------------------------------


def _tiled_threads(p: Params) -> int:
    return (int(p["BM"]) // int(p["TM"])) * (int(p["BN"]) // int(p["TN"]))


def tiled_shared_bytes(p: Params) -> int:
    """Static shared memory of one block: fp32 tiles, A padded by 4 floats a row."""
    stages = 2 if p["double_buffer"] else 1
    return stages * int(p["BK"]) * ((int(p["BM"]) + 4) + int(p["BN"])) * 4


MATMUL_CUDA_TILED = Template(
    name="matmul_cuda_tiled",
    problem="matmul",
    target="cuda",
    file="matmul_tiled.cu.j2",
    algorithm=(
        "SIMT: a block tile of C from BK-deep shared-memory tiles of A (stored k-major) and "
        "B, a TM x TN register tile per thread, 16-byte loads where rows are aligned"
    ),
    params=(
        Param("BM", (64, 128), "rows of C per block"),
        Param("BN", (64, 128), "columns of C per block"),
        Param("BK", (8, 16, 32), "depth of the shared-memory tiles"),
        Param("TM", (4, 8), "rows of C per thread"),
        Param("TN", (4, 8), "columns of C per thread"),
        Param(
            "double_buffer",
            (False, True),
            "two shared-memory stages: the next tile is loaded while this one is multiplied",
        ),
        Param("flags", CUDA_FLAGS, "nvcc flags"),
    ),
    constraints=(
        Constraint(
            "256 threads per block",
            "(BM / TM) * (BN / TN) = 8 warps: enough to hide latency at one or two blocks "
            "per SM, and each thread keeps a register tile of 16 to 64 accumulators",
            lambda p: _tiled_threads(p) == 256,
        ),
        Constraint(
            "shared memory within 48 KiB",
            "static shared memory is limited to 48 KiB per block",
            lambda p: tiled_shared_bytes(p) <= STATIC_SMEM_LIMIT,
        ),
    ),
    defaults={
        "BM": 64,
        "BN": 64,
        "BK": 16,
        "TM": 4,
        "TN": 4,
        "double_buffer": False,
        "flags": "-O3",
    },
    # 128 registers a thread: two blocks (16 warps) per SM hide the loads without a second stage
    best_known={
        "BM": 128,
        "BN": 128,
        "BK": 8,
        "TM": 8,
        "TN": 8,
        "double_buffer": False,
        "flags": "-O3",
    },
)


# tensor cores: wmma 16x16x16 fragments -------------------------------------------------


def _wmma_warps(p: Params) -> int:
    return (int(p["BM"]) // int(p["WM"])) * (int(p["BN"]) // int(p["WN"]))


def wmma_shared_bytes(p: Params) -> int:
    """Static shared memory of one block: the stages of 16-bit A and B tiles (padded rows),
    or the per-warp fp32 staging of the results if that is larger."""
    bk, pad = int(p["BK"]), int(p["pad"])
    stage = int(p["BM"]) * (bk + pad) + bk * (int(p["BN"]) + pad)
    return max(int(p["stages"]) * stage * 2, _wmma_warps(p) * 16 * 16 * 4)


MATMUL_CUDA_TENSORCORE = DtypeTemplate(
    name="matmul_cuda_tensorcore",
    problem="matmul",
    target="cuda",
    file="matmul_wmma.cu.j2",
    algorithm=(
        "tensor cores (wmma 16x16x16, fp32 accumulators): a block tile of C split into warp "
        "tiles, A and B streamed through a cp.async pipeline of padded shared-memory stages"
    ),
    params=(
        Param("BM", (64, 128), "rows of C per block"),
        Param("BN", (64, 128), "columns of C per block"),
        Param("BK", (16, 32), "depth of a pipeline stage"),
        Param("WM", (32, 64), "rows of C per warp"),
        Param("WN", (32, 64), "columns of C per warp"),
        Param("stages", (2, 3), "shared-memory stages in flight (2 = double buffering)"),
        Param("pad", (0, 8), "elements of padding per shared-memory row (against bank conflicts)"),
        Param("flags", CUDA_FLAGS, "nvcc flags"),
    ),
    constraints=(
        Constraint(
            "4 or 8 warps per block",
            "(BM / WM) * (BN / WN) warps",
            lambda p: _wmma_warps(p) in (4, 8),
        ),
        Constraint(
            "one of each transposed pair",
            "BM >= BN and WM >= WN: a tile and its transpose move as many bytes and do as "
            "many mma per fragment loaded, so the space keeps only the tall one",
            lambda p: int(p["BM"]) >= int(p["BN"]) and int(p["WM"]) >= int(p["WN"]),
        ),
        Constraint(
            "warp tiles of 64x32 at most",
            "a 64x64 warp tile holds 16 accumulator fragments (128 registers) plus its A and "
            "B fragments: it spills at the 255-register limit",
            lambda p: int(p["WM"]) * int(p["WN"]) <= 64 * 32,
        ),
        Constraint(
            "32x32 warp tiles only in 64x64 blocks",
            "a 32x32 warp tile reuses each loaded fragment twice; larger blocks can afford "
            "warp tiles that reuse them more",
            lambda p: (
                int(p["WM"]) * int(p["WN"]) > 32 * 32 or int(p["BM"]) * int(p["BN"]) == 64 * 64
            ),
        ),
        Constraint(
            "shared memory within 48 KiB",
            "static shared memory is limited to 48 KiB per block",
            lambda p: wmma_shared_bytes(p) <= STATIC_SMEM_LIMIT,
        ),
    ),
    defaults={
        "BM": 64,
        "BN": 64,
        "BK": 32,
        "WM": 32,
        "WN": 32,
        "stages": 2,
        "pad": 8,
        "flags": "-O3",
    },
    # three stages in flight and two blocks per SM: a 128x128 tile fits only two stages in 48 KiB
    best_known={
        "BM": 128,
        "BN": 64,
        "BK": 32,
        "WM": 64,
        "WN": 32,
        "stages": 3,
        "pad": 8,
        "flags": "-O3",
    },
    dtypes=("bf16", "fp16"),
)

MATMUL_TEMPLATES: tuple[Template, ...] = (MATMUL_CUDA_TILED, MATMUL_CUDA_TENSORCORE)
