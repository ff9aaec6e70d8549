"""Per-architecture limits a kernel's resources are checked against before it runs.

Figures from the CUDA C++ Programming Guide's table of compute-capability limits (the
same numbers `cudaGetDeviceProperties` reports). Device properties that vary between
boards of one architecture (L2 size, SM count, clocks) are not here: they are measured
on the host that runs the kernel. Nor are the block-size limits, the same on every
architecture listed: kernels.cuda_launch checks them (MAX_BLOCK, MAX_THREADS_PER_BLOCK).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ARCH = "sm_90"


@dataclass(frozen=True)
class ArchLimits:
    arch: str
    registers_per_thread: int
    registers_per_block: int
    register_allocation_unit: int
    """Registers are given to a warp in multiples of this many."""
    static_shared_per_block: int
    """Bytes of `__shared__` arrays a block may declare; ptxas refuses more."""
    max_shared_per_block_optin: int
    """Static plus dynamic shared memory of one block, once the loader opts in to it."""


class UnknownArch(ValueError):
    """An architecture this table does not describe."""


def _limits(arch: str, optin_kib: int) -> ArchLimits:
    return ArchLimits(
        arch=arch,
        registers_per_thread=255,
        registers_per_block=65536,
        register_allocation_unit=256,
        static_shared_per_block=48 * 1024,
        max_shared_per_block_optin=optin_kib * 1024,
    )


ARCHES: dict[str, ArchLimits] = {
    "sm_80": _limits("sm_80", 163),
    "sm_86": _limits("sm_86", 99),
    "sm_89": _limits("sm_89", 99),
    "sm_90": _limits("sm_90", 227),
    # Hopper with its architecture-specific instructions (wgmma, setmaxnreg).
    "sm_90a": _limits("sm_90a", 227),
}


def limits_for(arch: str) -> ArchLimits:
    try:
        return ARCHES[arch]
    except KeyError:
        raise UnknownArch(
            f"unknown CUDA architecture {arch!r}; known: {', '.join(ARCHES)}"
        ) from None


def registers_per_block(limits: ArchLimits, registers: int, threads: int) -> int:
    """Registers a block of `threads` threads is given when each thread uses `registers`:
    whole warps, each rounded up to the allocation unit."""
    unit = limits.register_allocation_unit
    per_warp = -(-registers * 32 // unit) * unit
    warps = -(-threads // 32)
    return warps * per_warp
