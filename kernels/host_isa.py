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
