"""What ptxas reports about each function it compiled, and what the PTX it read declares.

`nvcc -Xptxas -v` (CUDA 13.0, sm_90) reports every function like this:

    ptxas info    : Compiling entry function 'kf_softmax' for 'sm_90'
    ptxas info    : Function properties for kf_softmax
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 17 registers, used 1 barriers, 384 bytes smem
    ptxas info    : Compile time = 3.169 ms

The `Used` line names only what the function uses: `N bytes smem` is absent without
`__shared__` arrays, `N bytes cumulative stack size` appears with a stack frame, and
`N bytes cmem[B]` (one per constant bank) appears for sm_80-sm_89 but not for sm_90.
A non-inlined device function gets a `Function properties for <mangled name>` block
and a stack line but no `Used` line (it runs in its caller's registers), once per
kernel that calls it. ptxas does not report `__launch_bounds__`; the PTX does
(`.maxntid X, Y, Z`), so `max_threads_per_block` is filled from the PTX by the compiler.
"""

from __future__ import annotations

import re

import msgspec


class KernelResources(msgspec.Struct, frozen=True):
    kernel: str
    registers: int
    shared_bytes: int
    """Static shared memory (`__shared__` arrays); dynamic shared memory is the launch's."""
    constant_bytes: int
    """Sum over the constant banks ptxas names; 0 where it names none (sm_90 with CUDA 13)."""
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    max_threads_per_block: int | None
    """From `__launch_bounds__` (`.maxntid` or `.reqntid` in the PTX); None when unbounded."""
    barriers: int = 0
    entry: bool = True
    """False for a non-inlined device function: ptxas reports its stack and spills only,
    so its `registers` is 0."""


_COMPILING = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_PROPERTIES = re.compile(r"Function properties for (?P<name>\S+)")
_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, "
    r"(?P<loads>\d+) bytes spill loads"
)
_USED = re.compile(r"ptxas info\s*:\s*Used (?P<rest>.*)$")
_REGISTERS = re.compile(r"^(?P<n>\d+) registers?$")
_BARRIERS = re.compile(r"^used (?P<n>\d+) barriers?$")
_SMEM = re.compile(r"^(?P<n>\d+(?:\+\d+)?) bytes smem$")
_CMEM = re.compile(r"^(?P<n>\d+(?:\+\d+)?) bytes cmem\[\d+\]$")


def _total(text: str) -> int:
    return sum(int(part) for part in text.split("+"))


def parse_ptxas_report(log: str) -> tuple[KernelResources, ...]:
    """Every function ptxas reported in `log`, kernels first in report order, then the
    device functions (merged over the kernels that call them, keeping the largest figures)."""
    kernels: dict[str, dict[str, int]] = {}
    functions: dict[str, dict[str, int]] = {}
    current: str | None = None
    pending: dict[str, int] | None = None
    for line in log.splitlines():
        if (m := _COMPILING.search(line)) is not None:
            current = m["name"]
            kernels[current] = _blank()
            pending = None
        elif (m := _PROPERTIES.search(line)) is not None:
            name = m["name"]
            in_kernel = name == current and name in kernels
            pending = kernels[name] if in_kernel else functions.setdefault(name, _blank())
        elif (m := _FRAME.search(line)) is not None and pending is not None:
            for key, group in (("stack", "stack"), ("stores", "stores"), ("loads", "loads")):
                pending[key] = max(pending[key], int(m[group]))
            pending = None
        elif (m := _USED.search(line)) is not None and current in kernels:
            _read_used(m["rest"], kernels[current])
    found = [_resources(name, figures, entry=True) for name, figures in kernels.items()]
    found += [
        _resources(name, figures, entry=False)
        for name, figures in functions.items()
        if name not in kernels
    ]
    return tuple(found)


def _blank() -> dict[str, int]:
    return {
        "registers": 0,
        "barriers": 0,
        "smem": 0,
        "cmem": 0,
        "stack": 0,
        "stores": 0,
        "loads": 0,
    }


def _read_used(rest: str, figures: dict[str, int]) -> None:
    for part in (p.strip() for p in rest.split(",")):
        if (m := _REGISTERS.match(part)) is not None:
            figures["registers"] = int(m["n"])
        elif (m := _BARRIERS.match(part)) is not None:
            figures["barriers"] = int(m["n"])
        elif (m := _SMEM.match(part)) is not None:
            figures["smem"] = _total(m["n"])
        elif (m := _CMEM.match(part)) is not None:
            figures["cmem"] += _total(m["n"])


def _resources(name: str, figures: dict[str, int], *, entry: bool) -> KernelResources:
    return KernelResources(
        kernel=name,
        registers=figures["registers"],
        shared_bytes=figures["smem"],
        constant_bytes=figures["cmem"],
        stack_frame_bytes=figures["stack"],
        spill_store_bytes=figures["stores"],
        spill_load_bytes=figures["loads"],
        max_threads_per_block=None,
        barriers=figures["barriers"],
        entry=entry,
    )


def report_lines(log: str, function: str) -> str:
    """The lines of the ptxas report about one function (for evidence)."""
    lines: list[str] = []
    taking = False
    for line in log.splitlines():
        m = _COMPILING.search(line) or _PROPERTIES.search(line)
        if m is not None:
            taking = m["name"] == function
        elif "ptxas info" in line and not _USED.search(line):
            taking = False
        if taking:
            lines.append(line.rstrip())
    return "\n".join(dict.fromkeys(lines))


# The PTX ---------------------------------------------------------------------------


class PtxEntry(msgspec.Struct, frozen=True):
    """One `.entry` (a `__global__` function) as the PTX declares it."""

    name: str
    param_bytes: tuple[int, ...]
    max_threads: tuple[int, ...] | None = None
    """`.maxntid` (from `__launch_bounds__`)."""
    required_threads: tuple[int, ...] | None = None
    """`.reqntid`: the block must be exactly this."""


class PtxGlobal(msgspec.Struct, frozen=True):
    """A variable in the `.global` state space: device memory that outlives a launch."""

    name: str
    nbytes: int
    initialised: bool


class PtxFacts(msgspec.Struct, frozen=True):
    entries: tuple[PtxEntry, ...]
    extern_functions: tuple[str, ...]
    """Functions the PTX calls but does not define (device runtime: vprintf, malloc, ...)."""
    global_variables: tuple[PtxGlobal, ...]
    special_registers: tuple[str, ...]
    """Clock and timer registers the code reads (%clock, %clock64, %globaltimer, ...)."""


_ENTRY = re.compile(
    r"^[ \t]*(?:\.visible[ \t]+|\.weak[ \t]+)?\.entry[ \t]+(?P<name>[\w$]+)[ \t]*"
    r"\((?P<params>[^)]*)\)(?P<directives>[^{]*)\{",
    re.MULTILINE,
)
_PARAM = re.compile(
    r"\.param\s+(?:\.align\s+\d+\s+)?\.(?:[bsuf])(?P<bits>\d+)\s+"
    r"(?:\.ptr\s+(?:\.\w+\s+)*?(?:\.align\s+\d+\s+)?)?[\w$]+\s*(?:\[(?P<count>\d+)\])?"
)
_DIRECTIVE = re.compile(r"\.(?P<kind>maxntid|reqntid)\s+(?P<values>\d+(?:\s*,\s*\d+)*)")
_EXTERN_FUNC = re.compile(
    r"^[ \t]*\.extern[ \t]+\.func[ \t]+(?:\([^)]*\)[ \t]*)?(?P<name>[\w$]+)", re.MULTILINE
)
_GLOBAL = re.compile(
    r"^[ \t]*(?:\.(?:visible|extern|weak|common)[ \t]+)*\.global[ \t]+"
    r"(?:\.attribute\([^)]*\)[ \t]+)?(?:\.(?:align|ptr)[ \t]+\d*[ \t]*)*"
    r"(?:\.v\d[ \t]+)?\.(?:[bsuf])(?P<bits>\d+)[ \t]+(?P<name>[\w$]+)"
    r"(?:\[(?P<count>\d*)\])?(?P<init>[ \t]*=)?",
    re.MULTILINE,
)
_TIMERS = re.compile(r"%(globaltimer(?:_lo|_hi)?|clock64|clock(?:_hi)?)\b")


def parse_ptx(ptx: str) -> PtxFacts:
    entries = []
    for m in _ENTRY.finditer(ptx):
        params = tuple(
            int(p["bits"]) // 8 * int(p["count"] or 1) for p in _PARAM.finditer(m["params"])
        )
        bounds: dict[str, tuple[int, ...]] = {}
        for d in _DIRECTIVE.finditer(m["directives"]):
            bounds[d["kind"]] = tuple(int(v) for v in d["values"].split(","))
        entries.append(
            PtxEntry(
                name=m["name"],
                param_bytes=params,
                max_threads=bounds.get("maxntid"),
                required_threads=bounds.get("reqntid"),
            )
        )
    globals_ = tuple(
        PtxGlobal(
            name=m["name"],
            nbytes=int(m["bits"]) // 8 * int(m["count"] or 1),
            initialised=m["init"] is not None,
        )
        for m in _GLOBAL.finditer(ptx)
    )
    return PtxFacts(
        entries=tuple(entries),
        extern_functions=tuple(dict.fromkeys(m["name"] for m in _EXTERN_FUNC.finditer(ptx))),
        global_variables=globals_,
        special_registers=tuple(sorted({f"%{m[1]}" for m in _TIMERS.finditer(ptx)})),
    )
