"""Build a C kernel with the system compiler into a shared object, with a content-keyed cache.

The kernel is compiled after a prelude declaring the problem's exact prototype, so a
wrong signature is a compile error. A source is scanned by the real preprocessor first
(`source_scan`) and not compiled unless it passes. It is compiled to assembly, which may
hold only what GCC writes for C (`object_facts.foreign_assembler`), then assembled, and
its object is read for what it can do (`object_facts`); the static stage judges those
facts. The object is linked with a small support file that wraps the allocator
(`-Wl,--wrap`) so a refused allocation leaves a note on stderr; relocations are resolved
and read-only at load, and the stack is never executable.

A build is cached under everything it depends on: the source, flags and prototype, the
compiler's identity and system include directories, the support source, the fixed
flags, and `CHECKS_VERSION`, so a build recorded by older checks is checked again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import msgspec

from gpu_workers.build_cache import cached_build
from gpu_workers.compile_failure import CompileFailure
from gpu_workers.cpu.object_facts import foreign_assembler, object_facts
from gpu_workers.cpu.source_scan import scan_and_compile, scan_failure
from gpu_workers.cpu.toolchain import (
    COMPILER,
    DIAGNOSTIC_FLAGS,
    KERNEL_FILE,
    bad_flags,
    compiler_identity,
    default_cache_dir,
    kernel_lines,
    run_tool,
    system_include_dirs,
)
from gpu_workers.sandbox_outcome import ALLOCATION_REFUSED_MARK

LOG_LIMIT = 8000
WRAPPED = ("malloc", "calloc", "realloc", "aligned_alloc", "posix_memalign")
LINK_FLAGS = ("-Wl,-z,relro,-z,now,-z,noexecstack",)
"""Relocations resolved and made read-only at load; never an executable stack."""
CHECKS_VERSION = "object-facts-4"
"""Part of the cache key: a build recorded by older checks is checked again."""

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
    """What the kernel's own object needs from outside (weak references included)."""
    defined_symbols: tuple[str, ...]
    writable_sections: tuple[str, ...]
    """Every section of the kernel's object that is writable or thread-local and not empty,
    whatever its name, as 'name [flags, type, N bytes]: its symbols'; and COMMON symbols.
    The state a kernel could carry from one call into the next."""
    static_storage: tuple[str, ...]
    """The variables in those sections (and COMMON ones), as 'name (section, N bytes)'."""
    load_time_code: tuple[str, ...]
    """Code that would run when the library is loaded or unloaded: init/fini arrays,
    .ctors/.dtors, .init/.fini, GNU ifunc resolvers, a defined _init/_fini."""
    executable_data: tuple[str, ...]
    """Variables placed in executable sections (bytes that could be jumped into)."""
    forbidden_instructions: tuple[str, ...]
    """Instructions a compute kernel never needs, as 'mnemonic in function+0xOFFSET'."""
    log: str
    cache_hit: bool


def source_sha256(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def compile_kernel(
    source: str,
    flags: tuple[str, ...],
    *,
    prototype: str,
    cache_dir: Path | None = None,
    trusted_assembler: bool = False,
) -> CompiledKernel | CompileFailure:
    """Compile `source` (which must define `prototype`) into a cached shared object.

    A source whose preprocessing reads files outside the system include directories, or
    whose own tokens hold assembler, is not compiled (the same checks as the static
    stage's `source_check`, kept here too so that no caller can compile one). Only the
    harness's own sources (the calibration kernels) may hold assembler:
    `trusted_assembler`."""
    rejected = bad_flags(flags)
    if rejected:
        return CompileFailure(
            reason="bad_flags",
            message=f"compiler flags not allowed: {' '.join(rejected)}",
            log="allowed: optimisation levels, -march/-mtune=native, ISA -m flags, "
            "vectorisation and fast-math -f flags, -fopenmp, -D macros",
        )
    key = (
        source,
        " ".join(flags),
        prototype,
        compiler_identity(),
        SUPPORT_SOURCE,
        " ".join((*DIAGNOSTIC_FLAGS, *LINK_FLAGS)),
        "|".join(system_include_dirs()),
        CHECKS_VERSION,
        f"trusted_assembler={trusted_assembler}",
    )
    return cached_build(
        cache_dir or default_cache_dir(),
        key,
        CompiledKernel,
        lambda kernel: (kernel.library,),
        lambda work, entry: _build(source, flags, prototype, work, entry, trusted_assembler),
    )


def _build(
    source: str,
    flags: tuple[str, ...],
    prototype: str,
    work: Path,
    entry: Path,
    trusted_assembler: bool,
) -> CompiledKernel | CompileFailure:
    scan, code, out = scan_and_compile(source, flags, prototype=prototype, work=work)
    refused = scan_failure(scan, trusted_assembler=trusted_assembler)
    if refused is not None:
        return refused
    (work / "support.c").write_text(SUPPORT_SOURCE)
    common = [COMPILER, *flags, "-fPIC"]
    log = kernel_lines(out)[-LOG_LIMIT:]
    if code is None:
        return CompileFailure(reason="compile_timeout", message=out, log="")
    if code != 0:
        first = next((ln for ln in log.splitlines() if "error" in ln), "compiler error")
        return CompileFailure(reason="compile_error", message=first.strip(), log=log)
    if not trusted_assembler:
        foreign = foreign_assembler((work / "kernel.s").read_text(errors="replace"))
        if foreign:
            return CompileFailure(
                reason="forbidden_construct",
                message="the compiler's output holds assembler statements it never writes "
                "itself (strings the source passed through to the assembler): "
                + "; ".join(foreign),
                log="",
            )
    code, out = run_tool([*common, "-c", "kernel.s", "-o", "kernel.o"], work)
    if code != 0:
        return CompileFailure(
            reason="compile_error", message="the assembler refused the compiler's output", log=""
        )
    facts = object_facts(work / "kernel.o", work)
    code, support_log = run_tool(
        [COMPILER, "-O2", "-fPIC", "-c", "support.c", "-o", "support.o"], work
    )
    if code != 0:
        raise RuntimeError(
            f"the sandbox support file failed to compile: {support_log[-LOG_LIMIT:]}"
        )
    libs = ["-lm"]
    if any(s.startswith("_ZGV") for s in facts.undefined_symbols):
        libs.insert(0, "-lmvec")
    wrap = "-Wl," + ",".join(f"--wrap={name}" for name in WRAPPED)
    objects = ("kernel.o", "support.o", wrap)
    code, link_out = run_tool(
        [*common, *DIAGNOSTIC_FLAGS, "-shared", *objects, *LINK_FLAGS, *libs, "-o", "kernel.so"],
        work,
    )
    link_log = kernel_lines(link_out)
    if code != 0:
        return CompileFailure(
            reason="link_error", message="link failed", log=(log + "\n" + link_log).strip()
        )
    entry.mkdir(parents=True, exist_ok=True)
    library = entry / "kernel.so"
    os.replace(work / "kernel.so", library)
    os.replace(work / KERNEL_FILE, entry / KERNEL_FILE)
    return CompiledKernel(
        library=str(library),
        source_sha256=source_sha256(source),
        flags=flags,
        undefined_symbols=facts.undefined_symbols,
        defined_symbols=facts.defined_symbols,
        writable_sections=facts.writable_sections,
        static_storage=facts.static_storage,
        load_time_code=facts.load_time_code,
        executable_data=facts.executable_data,
        forbidden_instructions=facts.forbidden_instructions,
        log=(log + "\n" + link_log).strip()[-LOG_LIMIT:],
        cache_hit=False,
    )
