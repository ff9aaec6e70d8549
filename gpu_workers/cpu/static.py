"""The static stage for C kernels: what the compiled object may import, and what it must define.

An allowlist, not a denylist: a kernel computes; it has no business with files, processes,
time, signals or the network. Anything else it imports is refused before it ever runs.
Nor may it keep variables between calls: each call starts from its arguments alone, so
no timed call can reuse the work of an earlier one.
"""

from __future__ import annotations

import re

from gpu_workers.cpu.compiler import CompiledKernel
from gpu_workers.results import Rejection

_MATH = [
    "exp",
    "expf",
    "exp2",
    "exp2f",
    "expm1",
    "expm1f",
    "log",
    "logf",
    "log2f",
    "log1p",
    "log1pf",
    "sqrt",
    "sqrtf",
    "cbrtf",
    "tanh",
    "tanhf",
    "erf",
    "erff",
    "erfc",
    "erfcf",
    "fabs",
    "fabsf",
    "fmax",
    "fmaxf",
    "fmin",
    "fminf",
    "pow",
    "powf",
    "sin",
    "sinf",
    "cos",
    "cosf",
    "floor",
    "floorf",
    "ceil",
    "ceilf",
    "round",
    "roundf",
    "rint",
    "rintf",
    "lrint",
    "lrintf",
    "nearbyintf",
    "trunc",
    "truncf",
    "fma",
    "fmaf",
    "ldexpf",
    "frexpf",
    "copysignf",
]
_MEMORY = [
    "malloc",
    "calloc",
    "realloc",
    "free",
    "aligned_alloc",
    "posix_memalign",
    "memcpy",
    "memmove",
    "memset",
    "memcmp",
]
_RUNTIME = ("__stack_chk_fail", "_GLOBAL_OFFSET_TABLE_")
ALLOWED_SYMBOLS = frozenset((*_MATH, *_MEMORY, *_RUNTIME))
ALLOWED_PATTERNS = (
    re.compile(r"^GOMP_\w+$"),  # OpenMP runtime (parallel regions, loops, barriers)
    re.compile(r"^omp_(get|set)_\w+$"),
    re.compile(r"^_ZGV\w+$"),  # glibc libmvec vector math
    re.compile(r"^__\w+_finite$"),
)


_INCLUDE = re.compile(r"^\s*#\s*include\s*(\S.*?)\s*$", re.MULTILINE)
_SYSTEM_HEADER = re.compile(r"^<[A-Za-z0-9_][A-Za-z0-9_./-]*>$")
_FILE_READERS = re.compile(r"\.incbin|#\s*embed|__has_embed")


def source_check(source: str) -> Rejection | None:
    """Before compiling: a kernel is one file that includes system headers only, so the
    compiler cannot be made to read other files into the log or the object."""
    for match in _INCLUDE.finditer(source):
        target = match.group(1)
        if not _SYSTEM_HEADER.match(target) or ".." in target:
            return Rejection(
                stage="static",
                reason="forbidden_include",
                message=f"only system headers may be included, not {target}",
                evidence={"include": match.group(0).strip()},
            )
    found = _FILE_READERS.search(source)
    if found:
        return Rejection(
            stage="static",
            reason="forbidden_construct",
            message=f"{found.group(0)} would read a file into the kernel",
            evidence={"construct": found.group(0)},
        )
    return None


def allowed(symbol: str) -> bool:
    return symbol in ALLOWED_SYMBOLS or any(p.match(symbol) for p in ALLOWED_PATTERNS)


def static_check(compiled: CompiledKernel, entry_point: str = "kernel") -> Rejection | None:
    forbidden = [s for s in compiled.undefined_symbols if not allowed(s)]
    if forbidden:
        return Rejection(
            stage="static",
            reason="forbidden_symbol",
            message=f"the kernel calls functions a kernel may not use: {', '.join(forbidden)}",
            evidence={
                "forbidden": " ".join(forbidden),
                "imported": " ".join(compiled.undefined_symbols),
            },
        )
    if compiled.static_storage:
        return Rejection(
            stage="static",
            reason="kernel_state",
            message=(
                "the kernel has variables that outlive a call, so one call could hand its "
                f"work to the next: {', '.join(compiled.static_storage)}"
            ),
            evidence={"static_storage": "; ".join(compiled.static_storage)},
        )
    if entry_point not in compiled.defined_symbols:
        return Rejection(
            stage="static",
            reason="missing_entry_point",
            message=f"the source defines no exported function {entry_point!r}",
            evidence={"defined": " ".join(compiled.defined_symbols)},
        )
    return None
