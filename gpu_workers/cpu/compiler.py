"""Compile C kernels with the system compiler into shared objects, with a content-keyed cache.

The kernel is compiled after a prelude declaring the problem's exact prototype, so a
wrong signature is a compile error. The object is linked with a small support file that
wraps the allocator (`-Wl,--wrap`) so a refused allocation leaves a note on stderr.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
from pathlib import Path

import msgspec

from gpu_workers.build_cache import cached_build
from gpu_workers.cache_root import cache_root
from gpu_workers.compile_failure import CompileFailure
from gpu_workers.compiler_process import run_compiler
from gpu_workers.sandbox_outcome import ALLOCATION_REFUSED_MARK

COMPILER = os.environ.get("KFACTORY_CC", "cc")
COMPILE_TIMEOUT_S = 60.0
COMPILER_ADDRESS_SPACE = 4 << 30
LOG_LIMIT = 8000
WRAPPED = ("malloc", "calloc", "realloc", "aligned_alloc", "posix_memalign")

_ALLOWED_FLAGS = re.compile(
    r"^(-O[0-3s]|-Ofast|-march=native|-mtune=native"
    r"|-m(sse4\.2|avx|avx2|fma|avx512f|avx512bw|avx512vl|avx512dq|f16c|bmi2)"
    r"|-mprefer-vector-width=(128|256|512)"
    r"|-f(no-)?(fast-math|unroll-loops|unroll-all-loops|tree-vectorize|tree-loop-vectorize"
    r"|tree-slp-vectorize|math-errno|trapping-math|signed-zeros|finite-math-only"
    r"|associative-math|reciprocal-math|prefetch-loop-arrays|omit-frame-pointer"
    r"|strict-aliasing|vect-cost-model)"
    r"|-fvect-cost-model=(unlimited|dynamic|cheap|very-cheap)"
    r"|-fopenmp|-fopenmp-simd|-g|-w|-Wall|-Wextra"
    r"|-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.+-]+)?)$"
)

SUPPORT_SOURCE = r"""
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>
void *__real_malloc(size_t);
void *__real_calloc(size_t, size_t);
void *__real_realloc(void *, size_t);
void *__real_aligned_alloc(size_t, size_t);
int __real_posix_memalign(void **, size_t, size_t);
static void kf_note(const char *fn, size_t n) {
    char buf[160];
    int len = snprintf(buf, sizeof buf, "%s %s(%zu bytes)\n", "MARK", fn, n);
    if (len > 0) (void)!write(2, buf, (size_t)len);
}
void *__wrap_malloc(size_t n) {
    void *p = __real_malloc(n); if (!p && n) kf_note("malloc", n); return p; }
void *__wrap_calloc(size_t a, size_t b) {
    void *p = __real_calloc(a, b); if (!p && a && b) kf_note("calloc", a * b); return p; }
void *__wrap_realloc(void *q, size_t n) {
    void *p = __real_realloc(q, n); if (!p && n) kf_note("realloc", n); return p; }
void *__wrap_aligned_alloc(size_t a, size_t n) {
    void *p = __real_aligned_alloc(a, n); if (!p && n) kf_note("aligned_alloc", n); return p; }
int __wrap_posix_memalign(void **out, size_t a, size_t n) {
    int r = __real_posix_memalign(out, a, n); if (r && n) kf_note("posix_memalign", n); return r; }
""".replace("MARK", ALLOCATION_REFUSED_MARK)


class CompiledKernel(msgspec.Struct, frozen=True, kw_only=True):
    library: str
    """Path of the shared object."""
    source_sha256: str
    flags: tuple[str, ...]
    undefined_symbols: tuple[str, ...]
    """What the kernel's own object needs from outside (for the static stage)."""
    defined_symbols: tuple[str, ...]
    static_storage: tuple[str, ...]
    """Variables that outlive a call (globals, statics, thread-locals), as 'name (section,
    N bytes)': the state a kernel could carry from one call into the next."""
    log: str
    cache_hit: bool


def source_sha256(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def bad_flags(flags: tuple[str, ...]) -> list[str]:
    return [f for f in flags if not _ALLOWED_FLAGS.match(f)]


@functools.cache
def compiler_identity() -> str:
    try:
        out = subprocess.run(
            [COMPILER, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    return out.stdout.splitlines()[0] if out.stdout else "unknown"


def default_cache_dir() -> Path:
    return cache_root() / "cpu-kernels"


def compile_kernel(
    source: str,
    flags: tuple[str, ...],
    *,
    prototype: str,
    cache_dir: Path | None = None,
) -> CompiledKernel | CompileFailure:
    """Compile `source` (which must define `prototype`) into a cached shared object."""
    rejected = bad_flags(flags)
    if rejected:
        return CompileFailure(
            reason="bad_flags",
            message=f"compiler flags not allowed: {' '.join(rejected)}",
            log="allowed: optimisation levels, -march/-mtune=native, ISA -m flags, "
            "vectorisation and fast-math -f flags, -fopenmp, -D macros",
        )
    return cached_build(
        cache_dir or default_cache_dir(),
        (source, " ".join(flags), prototype, compiler_identity(), SUPPORT_SOURCE),
        CompiledKernel,
        lambda kernel: (kernel.library,),
        lambda work, entry: _build(source, flags, prototype, work, entry),
    )


def _run(argv: list[str], cwd: Path) -> tuple[int | None, str]:
    code, out = run_compiler(
        argv, cwd, timeout_s=COMPILE_TIMEOUT_S, address_space_bytes=COMPILER_ADDRESS_SPACE
    )
    return code, out[-LOG_LIMIT:]


def _symbols(obj: Path, cwd: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    code, out = _run(["nm", "-P", str(obj)], cwd)
    if code != 0:
        raise RuntimeError(f"nm failed on {obj}: {out}")
    undefined, defined = [], []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.append(name)
        elif kind in "TDBRW":
            defined.append(name)
    return tuple(sorted(set(undefined))), tuple(sorted(set(defined)))


_READ_ONLY_SECTION = re.compile(r"^(\*UND\*|\*ABS\*|\.text|\.rodata|\.data\.rel\.ro)")
_SYMBOL_LINE = re.compile(
    r"^[0-9a-f]+ (?P<flags>.{7}) (?P<section>\S+)\t(?P<size>[0-9a-f]+) (?P<name>.+)$"
)


def _static_storage(obj: Path, cwd: Path) -> tuple[str, ...]:
    """Every variable of `obj` outside code and read-only data, from its symbol table."""
    code, out = _run(["objdump", "-t", str(obj)], cwd)
    if code != 0:
        raise RuntimeError(f"objdump failed on {obj}: {out}")
    found = []
    for line in out.splitlines():
        match = _SYMBOL_LINE.match(line)
        if match is None or set(match["flags"]) & {"d", "f"}:  # section and file names
            continue
        if not _READ_ONLY_SECTION.match(match["section"]):
            found.append(f"{match['name']} ({match['section']}, {int(match['size'], 16)} bytes)")
    return tuple(sorted(found))


def _build(
    source: str, flags: tuple[str, ...], prototype: str, work: Path, entry: Path
) -> CompiledKernel | CompileFailure:
    prelude = f'#include <stdint.h>\n{prototype};\n#line 1 "kernel.c"\n'
    (work / "kernel.c").write_text(prelude + source)
    (work / "support.c").write_text(SUPPORT_SOURCE)
    common = [COMPILER, *flags, "-fPIC"]
    code, log = _run([*common, "-c", "kernel.c", "-o", "kernel.o"], work)
    if code is None:
        return CompileFailure(reason="compile_timeout", message=log, log=log)
    if code != 0:
        first = next((ln for ln in log.splitlines() if "error" in ln), "compiler error")
        return CompileFailure(reason="compile_error", message=first.strip(), log=log)
    undefined, defined = _symbols(work / "kernel.o", work)
    static_storage = _static_storage(work / "kernel.o", work)
    code, support_log = _run([COMPILER, "-O2", "-fPIC", "-c", "support.c", "-o", "support.o"], work)
    if code != 0:
        raise RuntimeError(f"the sandbox support file failed to compile: {support_log}")
    libs = ["-lm"]
    if any(s.startswith("_ZGV") for s in undefined):
        libs.insert(0, "-lmvec")
    wrap = "-Wl," + ",".join(f"--wrap={name}" for name in WRAPPED)
    code, link_log = _run(
        [*common, "-shared", "kernel.o", "support.o", wrap, *libs, "-o", "kernel.so"], work
    )
    if code != 0:
        log = log + link_log
        return CompileFailure(reason="link_error", message="link failed", log=log)
    entry.mkdir(parents=True, exist_ok=True)
    library = entry / "kernel.so"
    os.replace(work / "kernel.so", library)
    os.replace(work / "kernel.c", entry / "kernel.c")
    return CompiledKernel(
        library=str(library),
        source_sha256=source_sha256(source),
        flags=flags,
        undefined_symbols=undefined,
        defined_symbols=defined,
        static_storage=static_storage,
        log=(log + link_log)[-LOG_LIMIT:],
        cache_hit=False,
    )
