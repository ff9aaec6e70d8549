"""What the host's CPU can run: its x86 feature flags, read once from /proc/cpuinfo. A CPU
space's restriction reads it so that an explicit AVX-512 point is only searched on a host
that can run it (elsewhere it would compile only with -mavx512f and then fault)."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def host_cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def host_has(feature: str) -> bool:
    return feature in host_cpu_flags()


#: The vector and matrix extensions a report names, in order.
SIMD = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile")


def isa_words() -> str:
    """The host's vector instruction sets, for a report: `x86-64 sse4_2 avx avx2 fma`."""
    flags = host_cpu_flags()
    if not flags:
        return "unknown (no /proc/cpuinfo flags)"
    return " ".join(["x86-64", *(f for f in SIMD if f in flags)])
