"""What the host's CPU is and can run: its /proc/cpuinfo fields, read once, and its x86
feature flags among them. A CPU space's restriction reads the flags so that an explicit
AVX-512 point is only searched on a host that can run it (elsewhere it would compile only
with -mavx512f and then fault)."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ("model name", "cpu family", "model",
    "flags", ...); empty where the host has no such file."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():  # the first processor's block ends here
            break
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


@functools.cache
def host_cpu_flags() -> frozenset[str]:
    return frozenset(cpuinfo().get("flags", "").split())


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
