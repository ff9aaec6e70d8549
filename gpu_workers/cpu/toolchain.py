"""The C toolchain the CPU target builds with, and the policy it is run under.

The compiler (`KFACTORY_CC`, else `cc`) and its identity, which keys every build; the
flags a kernel may ask for (`bad_flags`) and the one the factory adds (`nan_safe`); the
compiler's own system include directories, the only place a kernel's includes may
resolve; the translation unit it compiles (`prelude` + source, as `kernel.c`) and the
part of its log that is kept (`kernel_lines`: only lines about `kernel.c` or its object
`kernel.o`, since a log may quote any file the compiler read). The compiler and its
tools run outside any kernel process, under a wall-clock timeout and prlimit caps
(`run_tool`); those that read a kernel's source see nothing else of the host
(`compile_root`).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

from gpu_workers.cache_root import cache_root
from gpu_workers.compiler_process import run_compiler
from gpu_workers.cpu.compile_root import confined

COMPILER = os.environ.get("KFACTORY_CC", "cc")
COMPILE_TIMEOUT_S = 60.0
COMPILER_ADDRESS_SPACE = 4 << 30
KERNEL_FILE = "kernel.c"
DIAGNOSTIC_FLAGS = ("-fdiagnostics-color=never", "-fno-diagnostics-show-caret")

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

FINITE_MATH_FLAGS = frozenset({"-ffast-math", "-Ofast", "-ffinite-math-only"})
NAN_SAFE_FLAG = "-fno-finite-math-only"


def nan_safe(flags: tuple[str, ...]) -> tuple[str, ...]:
    """The flags a kernel is built with, verified and timed alike: its own, and
    `-fno-finite-math-only` last where one of them lets the compiler assume there is no
    NaN or infinity (-ffast-math, -Ofast, -ffinite-math-only). What a kernel does with
    non-finite input is judged (`Problem.nonfinite`); a flag must not license ignoring it.
    Reassociation, reciprocals and contraction stay allowed."""
    flags = tuple(flags)
    if not FINITE_MATH_FLAGS.intersection(flags) or (flags and flags[-1] == NAN_SAFE_FLAG):
        return flags
    return (*flags, NAN_SAFE_FLAG)


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


@functools.cache
def system_include_dirs() -> tuple[str, ...]:
    """The directories the compiler searches for `#include <...>`, real paths, asked of
    the compiler itself (`cc -E -v -x c /dev/null`)."""
    try:
        out = subprocess.run(
            [COMPILER, "-E", "-v", "-x", "c", "/dev/null", "-o", "/dev/null"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            stdin=subprocess.DEVNULL,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C"},  # no CPATH
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    dirs, inside = [], False
    for line in out.stderr.splitlines():
        if line.startswith("#include <...> search starts here"):
            inside = True
        elif line.startswith("End of search list"):
            inside = False
        elif inside and line.startswith(" "):
            dirs.append(os.path.realpath(line.strip()))
    return tuple(dirs)


def default_cache_dir() -> Path:
    return cache_root() / "cpu-kernels"


def prelude(prototype: str) -> str:
    return f'#include <stdint.h>\n{prototype};\n#line 1 "{KERNEL_FILE}"\n'


def kernel_lines(log: str) -> str:
    """Only the diagnostics about the kernel's own file (or object): a compiler's log may
    otherwise quote other files it read."""
    keep = ("kernel.c:", "kernel.o:", "kernel.c(", "kernel.o(")
    return "\n".join(ln for ln in log.splitlines() if ln.startswith(keep) or "kernel.o" in ln)


def run_tool(
    argv: list[str], cwd: Path, *, confine: bool = False, compiler: str | None = None
) -> tuple[int | None, str]:
    """Run the compiler (or objdump) in `cwd` under the compile limits: (exit status,
    output), status None when it timed out. `confine`: where it reads a kernel's source,
    in a root that holds only the compiler's installation, the system headers and `cwd`
    (`compile_root`); `compiler`: the compiler `argv` runs, where `argv[0]` is a shell."""
    extra_env: dict[str, str] = {}
    if confine:
        argv, extra_env = confined(argv, cwd, compiler=compiler)
    return run_compiler(
        argv,
        cwd,
        timeout_s=COMPILE_TIMEOUT_S,
        address_space_bytes=COMPILER_ADDRESS_SPACE,
        extra_env=extra_env,
    )
