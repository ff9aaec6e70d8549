"""Build the harness's own C helpers (the kernel host, the fresh-input generator, the cache
flush) once per host and compiler, into the content-keyed build cache."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import msgspec

from gpu_workers.build_cache import cached_build
from gpu_workers.compiler_process import run_compiler
from gpu_workers.cpu.toolchain import COMPILER, compiler_identity, default_cache_dir

HERE = Path(__file__).parent
HOST_SOURCE = HERE / "kernel_host.c"
FRESH_INPUTS_SOURCE = HERE / "fresh_inputs.c"
CACHE_FLUSH_SOURCE = HERE / "cache_flush.c"


class TrustedBuild(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    cache_hit: bool


class TrustedBuildError(RuntimeError):
    """One of the harness's own helpers did not build: a broken host, not a bad kernel."""


def _build(
    source: Path, output: str, flags: list[str], link: list[str], cache_dir: Path | None
) -> Path:
    """Compile with `flags`, then link with `link` alone: a -ffast-math compile must not
    link crtfastmath.o, which would flush denormals in whatever process loads it."""
    text = source.read_text()

    def build(work: Path, entry: Path) -> TrustedBuild | str:
        (work / source.name).write_text(text)
        for argv in (
            [COMPILER, *flags, "-c", source.name, "-o", "built.o"],
            [COMPILER, "built.o", "-o", output, *link],
        ):
            code, log = run_compiler(argv, work, timeout_s=120, address_space_bytes=4 << 30)
            if code != 0:
                return f"{source.name} failed to build ({code}): {log[-4000:]}"
        entry.mkdir(parents=True, exist_ok=True)
        os.replace(work / output, entry / output)
        return TrustedBuild(path=str(entry / output), cache_hit=False)

    result = cached_build(
        cache_dir or default_cache_dir(),
        (text, " ".join(flags), " ".join(link), compiler_identity(), output),
        TrustedBuild,
        lambda b: (b.path,),
        build,
    )
    if isinstance(result, str):
        raise TrustedBuildError(result)
    return Path(result.path)


@functools.cache
def kernel_host(cache_dir: Path | None = None) -> Path:
    """The kernel host program (gpu_workers/cpu/kernel_host.c)."""
    return _build(HOST_SOURCE, "kf-kernel-host", ["-O2", "-Wall"], ["-ldl"], cache_dir)


@functools.cache
def fresh_inputs_library(cache_dir: Path | None = None) -> Path:
    """The fast generator of fresh timing inputs (gpu_workers/cpu/fresh_inputs.c)."""
    flags = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC"]
    link = ["-shared", "-fopenmp", "-lmvec", "-lm"]
    return _build(FRESH_INPUTS_SOURCE, "libkf-fresh-inputs.so", flags, link, cache_dir)


@functools.cache
def cache_flush_library(cache_dir: Path | None = None) -> Path:
    """The cache flush timing runs before every call (gpu_workers/cpu/cache_flush.c)."""
    flags = ["-O2", "-march=native", "-fopenmp", "-fPIC"]
    link = ["-shared", "-fopenmp"]
    return _build(CACHE_FLUSH_SOURCE, "libkf-cache-flush.so", flags, link, cache_dir)
