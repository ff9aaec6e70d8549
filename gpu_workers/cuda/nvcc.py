"""Compile CUDA kernel sources with nvcc into cubins, with a content-keyed cache.

One nvcc run builds the cubin and keeps the PTX it was assembled from:

    nvcc -cubin -arch=<arch> -Xptxas -v <flags> --keep --keep-dir keep kernel.cu -o kernel.cubin

The ptxas report (`-Xptxas -v`) gives each function's registers, shared memory, stack
and spills; the PTX gives each kernel's parameters and launch bounds and what the code
reaches outside itself (device-runtime calls, global variables, clock registers). Both
are stored in the build for the static stage. Only device code is compiled: nvcc
`-cubin` never builds or runs host code from the source.

It runs on any host, for the back end's architecture: the visible GPU's, or
`arch.DEFAULT_ARCH` (sm_90) where there is no usable GPU; an architecture `arch.py` has
no limits for is refused (UnknownArch). Flags outside the allow list, a dtype the
problem or the target does not take, and launch lines that do not parse or fit the
problem are refused before nvcc runs.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import msgspec

from gpu_workers.build_cache import cached_build
from gpu_workers.cache_root import cache_root
from gpu_workers.compile_failure import CompileFailure
from gpu_workers.compiler_process import run_compiler
from gpu_workers.cuda.arch import DEFAULT_ARCH, limits_for
from gpu_workers.cuda.ptxas import (
    KernelResources,
    PtxEntry,
    PtxGlobal,
    parse_ptx,
    parse_ptxas_report,
)
from kernels.cuda_launch import LaunchError, parse_launch_plan
from kernels.spec import Problem

__all__ = ["CompileFailure", "CudaBuild", "bad_flags", "compile_cuda"]

NVCC_ENV = "KFACTORY_NVCC"
COMPILE_TIMEOUT_S = 120.0
COMPILER_ADDRESS_SPACE = 8 << 30
LOG_LIMIT = 8000
CUDA_DTYPES = ("fp32", "bf16", "fp16")
BUILD_FORMAT = "cuda-build-1"
"""Part of the cache key: change it when the command or what a build records changes."""

_ALLOWED_FLAGS = re.compile(
    r"^(-O[0-3]"
    r"|--?use_fast_math|--?extra-device-vectorization|--?restrict"
    r"|-lineinfo|--generate-line-info"
    r"|--?maxrregcount=(1[6-9]|[2-9]\d|1\d\d|2[0-4]\d|25[0-5])"
    r"|--?(ftz|prec-div|prec-sqrt|fmad)=(true|false)"
    r"|-std=c\+\+(17|20)"
    r"|-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.+-]+)?)$"
)


class CudaBuild(msgspec.Struct, frozen=True, kw_only=True):
    cubin: str
    """Path of the cubin in the cache entry."""
    source: str
    """Path of the .cu it was built from, in the cache entry."""
    ptx: str
    """Path of the PTX ptxas assembled the cubin from."""
    arch: str
    dtype: str
    flags: tuple[str, ...]
    source_sha256: str
    resources: tuple[KernelResources, ...]
    """ptxas's figures for every kernel, then every non-inlined device function."""
    entries: tuple[PtxEntry, ...]
    extern_functions: tuple[str, ...]
    global_variables: tuple[PtxGlobal, ...]
    special_registers: tuple[str, ...]
    log: str
    """nvcc's output, the ptxas report included (truncated to LOG_LIMIT characters)."""
    cache_hit: bool


def source_sha256(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def bad_flags(flags: tuple[str, ...]) -> list[str]:
    return [f for f in flags if not _ALLOWED_FLAGS.match(f)]


def nvcc_path() -> str | None:
    return shutil.which(os.environ.get(NVCC_ENV) or "nvcc")


@functools.cache
def nvcc_identity(nvcc: str) -> str:
    """The release line of `nvcc --version` ("Cuda compilation tools, release 13.0, V13.0.88")."""
    try:
        out = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    lines = out.stdout.splitlines()
    return next((ln for ln in lines if "release" in ln), lines[-1] if lines else "unknown")


def default_cache_dir() -> Path:
    return cache_root() / "cuda-kernels"


def compile_cuda(
    source: str,
    flags: tuple[str, ...],
    *,
    problem: Problem,
    dtype: str,
    arch: str = DEFAULT_ARCH,
    cache_dir: Path | None = None,
) -> CudaBuild | CompileFailure:
    """Build `source` for `arch` into a cached cubin; an unknown `arch` raises UnknownArch.

    `source` must have passed static.source_check (the includes nvcc may read):
    CudaBackend.compile checks it first, so its refusal is a static-stage rejection.
    Refused here before nvcc runs: flags outside the allow list (bad_flags), a dtype the
    problem or this target does not take (unsupported_dtype), launch lines that do not
    parse or do not fit the problem (bad_launch) and a missing nvcc (no_compiler)."""
    limits_for(arch)
    rejected = bad_flags(flags)
    if rejected:
        return CompileFailure(
            reason="bad_flags",
            message=f"nvcc flags not allowed: {' '.join(rejected)}",
            log="allowed: -O0..-O3, --use_fast_math, --ftz/--prec-div/--prec-sqrt/--fmad="
            "true|false, -maxrregcount=16..255, --extra-device-vectorization, --restrict, "
            "-lineinfo, -std=c++17|c++20, -D macros; the target arch is the back end's",
        )
    if dtype not in CUDA_DTYPES or dtype not in problem.dtypes:
        return CompileFailure(
            reason="unsupported_dtype",
            message=f"{problem.name} on cuda takes {', '.join(problem.dtypes)}, not {dtype}",
            log="",
        )
    try:
        parse_launch_plan(source, problem)
    except LaunchError as err:
        return CompileFailure(reason="bad_launch", message=str(err), log="")
    nvcc = nvcc_path()
    if nvcc is None:
        wanted = os.environ.get(NVCC_ENV) or "nvcc"
        return CompileFailure(
            reason="no_compiler",
            message=f"nvcc not found ({wanted!r}): set {NVCC_ENV} to the nvcc to use "
            "or put nvcc on PATH",
            log="",
        )
    return cached_build(
        cache_dir or default_cache_dir(),
        (BUILD_FORMAT, source, " ".join(flags), arch, dtype, nvcc_identity(nvcc)),
        CudaBuild,
        lambda build: (build.cubin, build.ptx, build.source),
        lambda work, entry: _build(nvcc, source, flags, arch, dtype, work, entry),
    )


def _run(argv: list[str], cwd: Path) -> tuple[int | None, str]:
    return run_compiler(
        argv, cwd, timeout_s=COMPILE_TIMEOUT_S, address_space_bytes=COMPILER_ADDRESS_SPACE
    )


def _truncated(log: str) -> str:
    if len(log) <= LOG_LIMIT:
        return log
    return log[:LOG_LIMIT] + f"\n... ({len(log) - LOG_LIMIT} more characters)"


def _build(
    nvcc: str,
    source: str,
    flags: tuple[str, ...],
    arch: str,
    dtype: str,
    work: Path,
    entry: Path,
) -> CudaBuild | CompileFailure:
    (work / "kernel.cu").write_text(source)
    (work / "keep").mkdir()
    argv = [nvcc, "-cubin", f"-arch={arch}", "-Xptxas", "-v", *flags]
    argv += ["--keep", "--keep-dir", "keep", "kernel.cu", "-o", "kernel.cubin"]
    code, log = _run(argv, work)
    if code is None:
        return CompileFailure(reason="compile_timeout", message=log, log=log)
    if code != 0:
        first = next(
            (ln for ln in log.splitlines() if re.search(r"\berror\b", ln)),
            f"nvcc exited with status {code}",
        )
        return CompileFailure(reason="compile_error", message=first.strip(), log=_truncated(log))
    missing = [p for p in ("kernel.cubin", "keep/kernel.ptx") if not (work / p).is_file()]
    if missing:
        message = f"nvcc reported success but wrote no {' or '.join(missing)}"
        return CompileFailure(reason="compile_error", message=message, log=_truncated(log))
    ptx_text = (work / "keep" / "kernel.ptx").read_text()
    facts = parse_ptx(ptx_text)
    bounds = {e.name: e.required_threads or e.max_threads for e in facts.entries}
    threads = {name: math.prod(b) for name, b in bounds.items() if b is not None}
    resources = tuple(
        msgspec.structs.replace(r, max_threads_per_block=threads.get(r.kernel))
        for r in parse_ptxas_report(log)
    )
    entry.mkdir(parents=True, exist_ok=True)
    cubin, ptx, cu = entry / "kernel.cubin", entry / "kernel.ptx", entry / "kernel.cu"
    os.replace(work / "keep" / "kernel.ptx", ptx)
    os.replace(work / "kernel.cu", cu)
    os.replace(work / "kernel.cubin", cubin)
    return CudaBuild(
        cubin=str(cubin),
        source=str(cu),
        ptx=str(ptx),
        arch=arch,
        dtype=dtype,
        flags=flags,
        source_sha256=source_sha256(source),
        resources=resources,
        entries=facts.entries,
        extern_functions=facts.extern_functions,
        global_variables=facts.global_variables,
        special_registers=facts.special_registers,
        log=_truncated(log),
        cache_hit=False,
    )
