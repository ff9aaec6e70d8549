"""The static stage for CUDA kernels: refuse before anything runs on a GPU.

Everything here needs only the source, nvcc's PTX and the ptxas report, so a host
without a GPU (a laptop, CI) filters candidates exactly as a GPU host would. All
rejections are stage "static".

Before compiling, `source_check` (CudaBackend.compile runs it before nvcc is called):

- forbidden_include: only headers on ALLOWED_HEADERS, spelled `<name>`. A quoted or
  computed include, `#include_next`, `#import` or `#embed` could make the compiler read
  a file of the host into its log. Directives hidden behind comments, line splices or
  the `%:` digraph are found too; include-like text in a comment or string is refused
  as well (a kernel has no need for one). libcu++'s `<cuda/barrier>` and
  `<cuda/pipeline>` are left out: their waits back off by reading %globaltimer, which
  the clock rule below refuses (use `__syncthreads`, cooperative groups,
  `<cuda_pipeline.h>` or mbarrier PTX).
- forbidden_construct: `.incbin` (assembles a file into the object).

After compiling, `static_check` reads the PTX, which is what runs, so a macro cannot
hide a construct from it:

- forbidden_symbol: any call into the device runtime (`.extern .func`): `printf`
  (vprintf) writes into the worker's stdout, `malloc`/`free` keep memory alive between
  calls, `assert` (__assertfail) prints and kills the context. A kernel computes from its
  arguments; there is nothing else for it to call.
- forbidden_construct, clock: reading %clock, %clock64 or %globaltimer lets a kernel act
  differently when it is timed than when it is verified.
- forbidden_construct, device global: a `__device__`/`__managed__` variable (or a
  written-to string literal) outlives the launch, so a kernel could count its calls or
  remember inputs and skip work; scratch memory is a `kf-buffer` (zeroed before every
  call) and tables are `__constant__`. Allowed: libdevice's read-only tables
  (`__cudart_*`, e.g. sinf's range reduction) and libcu++'s 1-byte tag objects in
  cuda::std, which the CUDA headers bring in (`<cooperative_groups.h>` does).
- missing_entry_point: every launched kernel is a `.entry` of that exact name (so
  `extern "C"`); signature_mismatch: it takes exactly one 8-byte parameter per launch
  argument (device pointers and `int64_t` dims).
- bad_launch: a launch whose grid or block is out of range at a known shape.
- launch_bounds: a block larger than the kernel's `__launch_bounds__` (`.maxntid`), or
  different from its `.reqntid`; the launch would fail.
- too_many_registers: more than the arch's registers per thread, or a block whose warps
  need more registers than a block may have (each warp's share rounded up to the
  allocation unit); the launch would fail with "too many resources requested".
- shared_memory_exceeded: static shared memory over the arch's 48 KiB per block, or
  static plus dynamic over the most a block may opt in to.
- register_spill: any bytes spilled to local memory by a kernel or a device function it
  calls. Spilling is refused on every host: it is always a slow kernel, and the search
  has register budgets (`-maxrregcount`, `__launch_bounds__`, smaller tiles) to avoid it.
  Local arrays (a stack frame without spills) are allowed.

Sizes in the launch lines may depend on the dims. Those launches are checked at each
shape in `shapes` (the back end passes the problem's test shapes and default shape);
with no shapes, the block- and smem-dependent checks of such launches are skipped and
the runtime's launch errors remain the check.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gpu_workers.cuda.arch import ArchLimits, limits_for, registers_per_block
from gpu_workers.cuda.ptxas import KernelResources, PtxEntry, PtxGlobal, report_lines
from gpu_workers.results import Rejection
from kernels.cuda_launch import MAX_BLOCK, Launch, LaunchError, LaunchPlan

if TYPE_CHECKING:
    from gpu_workers.cuda.nvcc import CudaBuild

ALLOWED_HEADERS = frozenset(
    {
        "stdint.h",
        "cstdint",
        "float.h",
        "cfloat",
        "math.h",
        "cmath",
        "limits.h",
        "climits",
        "string.h",  # device memcpy/memset, for type punning
        "cstring",
        "cuda_runtime.h",
        "cuda_fp16.h",
        "cuda_bf16.h",
        "mma.h",
        "cuda_pipeline.h",
        "cooperative_groups.h",
        "cooperative_groups/reduce.h",
        "cooperative_groups/memcpy_async.h",
    }
)

_SPLICE = re.compile(r"\\\r?\n")
_GAP = r"(?:[ \t]|/\*.*?\*/)*"
_DIRECTIVE = re.compile(
    rf"(?:#|%:){_GAP}(?P<word>include_next|include|import|embed)\b{_GAP}"
    r'(?P<target><[^>\n]*>|"[^"\n]*"|\S*)',
    re.DOTALL,
)
_FILE_READERS = re.compile(r"\.incbin\b")

_LIBDEVICE_TABLE = re.compile(r"^__cudart_\w+$")
_LIBCUDACXX_TAG = re.compile(r"^_ZN\d+_INTERNAL_\w*?4cuda3std\w*E$")


def _reject(reason: str, message: str, evidence: dict[str, str]) -> Rejection:
    return Rejection(stage="static", reason=reason, message=message, evidence=evidence)


def source_check(source: str) -> Rejection | None:
    """Before compiling: includes from the allow list only, nothing that reads a file."""
    text = _SPLICE.sub("", source)
    for match in _DIRECTIVE.finditer(text):
        target = match["target"]
        header = target[1:-1] if target.startswith("<") and target.endswith(">") else None
        if match["word"] != "include" or header not in ALLOWED_HEADERS:
            return _reject(
                "forbidden_include",
                f"#{match['word']} {target} is not allowed; a kernel may include only "
                f"<{'>, <'.join(sorted(ALLOWED_HEADERS))}>",
                {"directive": match.group(0).strip()[:200]},
            )
    found = _FILE_READERS.search(text)
    if found:
        return _reject(
            "forbidden_construct",
            f"{found.group(0)} would read a file into the kernel",
            {"construct": found.group(0)},
        )
    return None


def static_check(
    build: CudaBuild, plan: LaunchPlan, *, shapes: Sequence[Mapping[str, int]] = ()
) -> Rejection | None:
    """After compiling: the rules in the module docstring, in that order."""
    return (
        _runtime_calls(build)
        or _clock_reads(build)
        or _device_globals(build)
        or _entry_points(build, plan)
        or _launch_resources(build, plan, shapes)
        or _spills(build)
    )


def _runtime_calls(build: CudaBuild) -> Rejection | None:
    if not build.extern_functions:
        return None
    names = ", ".join(build.extern_functions)
    return _reject(
        "forbidden_symbol",
        f"the kernel calls device-runtime functions a kernel may not use: {names} "
        "(printf, malloc/free, assert and the like)",
        {"extern_functions": names},
    )


def _clock_reads(build: CudaBuild) -> Rejection | None:
    if not build.special_registers:
        return None
    names = ", ".join(build.special_registers)
    return _reject(
        "forbidden_construct",
        f"the kernel reads {names}: a kernel may not read clocks or timers (clock(), "
        "clock64(), %globaltimer), which let it behave differently when timed",
        {"construct": "clock", "registers": names},
    )


def _system_global(g: PtxGlobal) -> bool:
    if _LIBDEVICE_TABLE.match(g.name):
        return g.initialised
    return bool(_LIBCUDACXX_TAG.match(g.name)) and g.nbytes == 1 and not g.initialised


def _device_globals(build: CudaBuild) -> Rejection | None:
    found = [g for g in build.global_variables if not _system_global(g)]
    if not found:
        return None
    listed = ", ".join(f"{g.name} ({g.nbytes} bytes)" for g in found)
    return _reject(
        "forbidden_construct",
        f"the kernel declares device memory that outlives a launch: {listed}; use a "
        "kf-buffer for scratch (zeroed before every call) and __constant__ for tables",
        {"construct": "device global", "globals": listed},
    )


def _entry_points(build: CudaBuild, plan: LaunchPlan) -> Rejection | None:
    entries = {e.name: e for e in build.entries}
    for launch in plan.launches:
        entry = entries.get(launch.kernel)
        if entry is None:
            token = f"{len(launch.kernel)}{launch.kernel}"
            mangled = [n for n in entries if n.startswith("_Z") and token in n]
            hint = (
                f'; {", ".join(mangled)} is it with a C++ name: declare it extern "C"'
                if mangled
                else f"; it defines {', '.join(entries) or 'none'}"
            )
            return _reject(
                "missing_entry_point",
                f"the launch names {launch.kernel}, but the source defines no "
                f'extern "C" __global__ function of that name{hint}',
                {"kernel": launch.kernel, "entries": " ".join(entries) or "(none)"},
            )
        wanted = len(launch.args)
        if len(entry.param_bytes) != wanted or any(b != 8 for b in entry.param_bytes):
            return _reject(
                "signature_mismatch",
                f"{launch.kernel} is launched with {wanted} arguments, each 8 bytes (device "
                f"pointers and int64_t dims), but takes parameters of "
                f"{list(entry.param_bytes)} bytes",
                {
                    "kernel": launch.kernel,
                    "launch_args": ", ".join(launch.args),
                    "param_bytes": " ".join(str(b) for b in entry.param_bytes),
                },
            )
    return None


def _dims_used(launch: Launch) -> set[str]:
    exprs = [*launch.block, launch.shared_bytes]
    calls = {"cdiv", "min", "max"}
    return {n.id for e in exprs for n in ast.walk(e.tree) if isinstance(n, ast.Name)} - calls


def _launch_resources(
    build: CudaBuild, plan: LaunchPlan, shapes: Sequence[Mapping[str, int]]
) -> Rejection | None:
    limits = limits_for(build.arch)
    for shape in shapes:
        try:
            plan.resolve(shape)
        except LaunchError as err:
            return _reject("bad_launch", str(err), {"shape": str(dict(shape))})
    resources = {r.kernel: r for r in build.resources if r.entry}
    entries = {e.name: e for e in build.entries}
    for launch in plan.launches:
        points: Sequence[Mapping[str, int]] = shapes if _dims_used(launch) else ({},)
        for dims in points:
            block = (*(e.value(dims) for e in launch.block), 1, 1)[:3]
            shared = launch.shared_bytes.value(dims)
            where = {"kernel": launch.kernel, "shape": str(dict(dims)) if dims else "any"}
            if any(not 1 <= b <= most for b, most in zip(block, MAX_BLOCK, strict=True)):
                return _reject(
                    "bad_launch", f"{launch.kernel}: block {block} is out of range", where
                )
            if launch.kernel not in resources:
                raise RuntimeError(f"ptxas reported nothing about the entry {launch.kernel}")
            found = _one_launch(
                limits,
                resources[launch.kernel],
                entries[launch.kernel],
                block,
                shared,
                where,
                build.log,
            )
            if found is not None:
                return found
    return None


def _one_launch(
    limits: ArchLimits,
    r: KernelResources,
    entry: PtxEntry,
    block: tuple[int, ...],
    dynamic: int,
    where: dict[str, str],
    log: str,
) -> Rejection | None:
    threads = block[0] * block[1] * block[2]
    arch = {
        "arch": limits.arch,
        "block": str(block),
        "threads_per_block": str(threads),
        "ptxas": report_lines(log, r.kernel),
    }
    if entry.required_threads is not None:
        required = (*entry.required_threads, 1, 1)[:3]
        if tuple(block) != required:
            return _reject(
                "launch_bounds",
                f"{r.kernel} requires a block of exactly {required} (.reqntid), "
                f"launched with {block}",
                {**where, **arch, "reqntid": str(required)},
            )
    if r.max_threads_per_block is not None and threads > r.max_threads_per_block:
        return _reject(
            "launch_bounds",
            f"{r.kernel} is launched with {threads} threads per block, more than its "
            f"__launch_bounds__ of {r.max_threads_per_block}",
            {**where, **arch, "launch_bounds": str(r.max_threads_per_block)},
        )
    allocated = registers_per_block(limits, r.registers, threads)
    if r.registers > limits.registers_per_thread or allocated > limits.registers_per_block:
        return _reject(
            "too_many_registers",
            f"{r.kernel} uses {r.registers} registers per thread; a block of {threads} "
            f"threads needs {allocated} registers, more than the {limits.registers_per_block} "
            f"a block may have on {limits.arch}",
            {
                **where,
                **arch,
                "registers": str(r.registers),
                "registers_per_block": str(allocated),
                "limit_per_block": str(limits.registers_per_block),
                "limit_per_thread": str(limits.registers_per_thread),
            },
        )
    total = r.shared_bytes + dynamic
    if r.shared_bytes > limits.static_shared_per_block or total > limits.max_shared_per_block_optin:
        return _reject(
            "shared_memory_exceeded",
            f"{r.kernel} needs {r.shared_bytes} bytes of static and {dynamic} of dynamic "
            f"shared memory ({total} in all); {limits.arch} allows "
            f"{limits.static_shared_per_block} static and {limits.max_shared_per_block_optin} "
            "in all per block",
            {
                **where,
                **arch,
                "static_shared_bytes": str(r.shared_bytes),
                "dynamic_shared_bytes": str(dynamic),
                "limit_static": str(limits.static_shared_per_block),
                "limit_total": str(limits.max_shared_per_block_optin),
            },
        )
    return None


def _spills(build: CudaBuild) -> Rejection | None:
    for r in build.resources:
        if r.spill_store_bytes or r.spill_load_bytes:
            what = "kernel" if r.entry else "device function"
            return _reject(
                "register_spill",
                f"{what} {r.kernel} spills registers to local memory "
                f"({r.spill_store_bytes} bytes stored, {r.spill_load_bytes} loaded, "
                f"{r.registers} registers); spilling is refused on every host",
                {
                    "kernel": r.kernel,
                    "arch": build.arch,
                    "registers": str(r.registers),
                    "spill_store_bytes": str(r.spill_store_bytes),
                    "spill_load_bytes": str(r.spill_load_bytes),
                    "stack_frame_bytes": str(r.stack_frame_bytes),
                    "limit_per_thread": str(limits_for(build.arch).registers_per_thread),
                    "flags": " ".join(build.flags),
                    "ptxas": report_lines(build.log, r.kernel),
                },
            )
    return None
