"""The static stage for C kernels: what the compiled object may import, and what it must define.

An allowlist, not a denylist: a kernel computes; it has no business with files, processes,
time, signals or the network. Anything else it imports is refused before it ever runs.
Nor may it keep variables between calls: each call starts from its arguments alone, so
no timed call can reuse the work of an earlier one.

Everything is judged by what it can do, never by what it is called: a section is storage
when its flags say writable or thread-local, whatever its name; code runs at load when a
section's type (or the loader's section name) says so; an instruction is forbidden however
it got into the object; a header is allowed when the real preprocessor found it under
the compiler's own system include directories.

`source_check` (before compiling): `.incbin` or `#embed` (forbidden_construct), an
include outside those directories (forbidden_include: the refusal names only the path),
assembler among the kernel's own tokens after macro expansion, or forged line markers
(forbidden_construct). `static_check` (the object, as `build.ObjectFacts` read it): an
import off the allow list (forbidden_symbol: maths, memory, the OpenMP runtime GCC emits
and its read-only queries, no `omp_set_*`), code that runs at load or unload (init or
fini arrays, constructors, ifuncs: load_time_code), writable or thread-local storage
(kernel_state), data among code (executable_data), instructions a compute kernel never
needs, found by disassembly (forbidden_instruction: `syscall`, `int`, `rdtsc`, `rdrand`,
loads of MXCSR or the x87 control word, ...), and no exported `kernel`
(missing_entry_point).
"""

from __future__ import annotations

import re

from gpu_workers.cpu.build import CompiledKernel
from gpu_workers.cpu.source_scan import scan_source
from gpu_workers.cpu.toolchain import bad_flags
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

_LOOP_KINDS = (
    "static",
    "dynamic",
    "guided",
    "runtime",
    "nonmonotonic_dynamic",
    "nonmonotonic_guided",
    "nonmonotonic_runtime",
    "maybe_nonmonotonic_runtime",
    "ordered_static",
    "ordered_dynamic",
    "ordered_guided",
    "ordered_runtime",
    "doacross_static",
    "doacross_dynamic",
    "doacross_guided",
    "doacross_runtime",
)
_OPENMP = (
    # parallel regions (plain and combined with a loop or sections)
    "GOMP_parallel",
    "GOMP_parallel_start",
    "GOMP_parallel_end",
    *(f"GOMP_parallel_loop_{kind}" for kind in _LOOP_KINDS[:8]),
    "GOMP_parallel_sections",
    # worksharing loops of every schedule, signed and unsigned long long
    *(
        f"GOMP_loop_{ull}{kind}_{step}"
        for ull in ("", "ull_")
        for kind in _LOOP_KINDS
        for step in ("start", "next")
    ),
    *(
        f"GOMP_loop_{ull}{kind}start"
        for ull in ("", "ull_")
        for kind in ("", "ordered_", "doacross_")
    ),
    "GOMP_loop_end",
    "GOMP_loop_end_nowait",
    "GOMP_ordered_start",
    "GOMP_ordered_end",
    "GOMP_doacross_post",
    "GOMP_doacross_wait",
    "GOMP_doacross_ull_post",
    "GOMP_doacross_ull_wait",
    "GOMP_sections_start",
    "GOMP_sections_next",
    "GOMP_sections_end",
    "GOMP_sections_end_nowait",
    # synchronisation, single, reductions (atomics or a critical section)
    "GOMP_barrier",
    "GOMP_critical_start",
    "GOMP_critical_end",
    "GOMP_critical_name_start",
    "GOMP_critical_name_end",
    "GOMP_atomic_start",
    "GOMP_atomic_end",
    "GOMP_single_start",
    "GOMP_single_copy_start",
    "GOMP_single_copy_end",
    # queries that change nothing
    "omp_get_thread_num",
    "omp_get_num_threads",
    "omp_get_max_threads",
    "omp_get_num_procs",
    "omp_in_parallel",
)
"""What GCC emits for `omp parallel`, `for` (every schedule), `sections`, `simd`, `barrier`,
`critical`, `atomic`, `single`, `ordered` and reductions, and the read-only queries. No
`omp_set_*` (a setting parked in the runtime survives into the next call), no clocks
(`omp_get_wtime`), no tasks, targets or locks."""
ALLOWED_SYMBOLS = frozenset((*_MATH, *_MEMORY, *_RUNTIME, *_OPENMP))
ALLOWED_PATTERNS = (
    re.compile(
        r"^_ZGV[bcde][NM][0-9]+[a-z0-9]*_(acos|acosh|asin|asinh|atan|atan2|atanh|cbrt|cos|cosh"
        r"|erf|erfc|exp|exp10|exp2|expm1|hypot|log|log10|log1p|log2|pow|sin|sincos|sinh|tan"
        r"|tanh)f?$"
    ),
    re.compile(rf"^__(?:{'|'.join(_MATH)})_finite$"),
)
"""glibc's libmvec vector maths (`_ZGV<isa><mask><len><args>_<function>`) and the
`__*_finite` variants older glibc headers route maths through under -ffast-math."""


_FILE_READERS = re.compile(r"\.incbin|#\s*embed|__has_embed")


def file_reader_check(source: str) -> Rejection | None:
    """`.incbin`, `#embed` or `__has_embed`: a construct that would read a file into the
    kernel, refused before anything reads the source."""
    found = _FILE_READERS.search(source)
    if found is None:
        return None
    return Rejection(
        stage="static",
        reason="forbidden_construct",
        message=f"{found.group(0)} would read a file into the kernel",
        evidence={"construct": found.group(0)},
    )


def source_check(
    source: str, flags: tuple[str, ...] = (), *, prototype: str = ""
) -> Rejection | None:
    """Before compiling: the real preprocessor, with the flags the kernel is built with,
    may read only files under the compiler's system include directories (so the compiler
    cannot be made to read another file into its log or the object), and the kernel's own
    tokens, after macro expansion, may hold no assembler. A refusal names only the paths
    and positions: nothing a file says. Sources the preprocessor cannot handle, and flags
    that are not allowed, are left to the compile stage to report."""
    reads = file_reader_check(source)
    if reads is not None:
        return reads
    if bad_flags(flags):
        return None
    scan = scan_source(source, flags, prototype=prototype)
    if scan.outside_includes:
        paths = " ".join(scan.outside_includes)
        return Rejection(
            stage="static",
            reason="forbidden_include",
            message=f"only system headers may be included; the source reads {paths}",
            evidence={"includes": paths},
        )
    if scan.assembler or scan.forged_line_markers:
        found_text = "; ".join((*scan.assembler, *scan.forged_line_markers))
        return Rejection(
            stage="static",
            reason="forbidden_construct",
            message=f"a kernel is C without assembler: {found_text}",
            evidence={
                "assembler": "; ".join(scan.assembler),
                "line_markers": "; ".join(scan.forged_line_markers),
            },
        )
    return None


def allowed(symbol: str) -> bool:
    return symbol in ALLOWED_SYMBOLS or any(p.match(symbol) for p in ALLOWED_PATTERNS)


def static_check(compiled: CompiledKernel, entry_point: str = "kernel") -> Rejection | None:
    """Judge the object by what it can do: what it imports, whether it keeps writable or
    thread-local storage, runs code at load, hides data among code, or holds instructions
    a compute kernel never needs; and that it defines the entry point."""
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
    if compiled.load_time_code:
        return Rejection(
            stage="static",
            reason="load_time_code",
            message=(
                "the kernel has code that runs when it is loaded or unloaded: "
                + "; ".join(compiled.load_time_code)
            ),
            evidence={"load_time_code": "; ".join(compiled.load_time_code)},
        )
    if compiled.writable_sections:
        return Rejection(
            stage="static",
            reason="kernel_state",
            message=(
                "the kernel has writable or thread-local storage that outlives a call, so one "
                f"call could hand its work to the next: {'; '.join(compiled.writable_sections)}"
            ),
            evidence={
                "writable_sections": "; ".join(compiled.writable_sections),
                "static_storage": "; ".join(compiled.static_storage),
            },
        )
    if compiled.executable_data:
        return Rejection(
            stage="static",
            reason="executable_data",
            message=(
                "the kernel places variables among its code: " + "; ".join(compiled.executable_data)
            ),
            evidence={"executable_data": "; ".join(compiled.executable_data)},
        )
    if compiled.forbidden_instructions:
        return Rejection(
            stage="static",
            reason="forbidden_instruction",
            message=(
                "the kernel's code holds instructions a compute kernel never needs: "
                + "; ".join(compiled.forbidden_instructions)
            ),
            evidence={"instructions": "; ".join(compiled.forbidden_instructions)},
        )
    if entry_point not in compiled.defined_symbols:
        return Rejection(
            stage="static",
            reason="missing_entry_point",
            message=f"the source defines no exported function {entry_point!r}",
            evidence={"defined": " ".join(compiled.defined_symbols)},
        )
    return None
