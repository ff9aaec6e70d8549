"""The launch contract of a CUDA kernel source, written in the source itself.

A CUDA source for the cuda target holds only device code (`__global__` functions built
into a cubin); how to run it travels with it as comment lines, so every event that carries
the source also carries how to launch it:

    // kf-buffer: kf_buf0 bytes=4*rows*cols
    // kf-launch: kf_softmax(x, y, rows, cols) grid=(cdiv(rows, 4)) block=(128) smem=0

- `kf-launch` lines run in order on one stream: an `extern "C" __global__` function, its
  arguments, its grid and block (one to three values each) and its dynamic shared memory
  in bytes (default 0).
- An argument is a problem argument (a device pointer), a declared buffer (a device
  pointer to scratch memory the loader allocates and zeroes before every call) or a dim
  (passed as `int64_t`).
- `kf-buffer` declares scratch memory by size in bytes.
- Sizes are integer expressions over the dims: integers, dim names, `+ - * // %`, and
  `cdiv(a, b)`, `min(...)`, `max(...)`.

The loader never runs host code from the source, so a kernel cannot compute its answer on
the CPU or reach anything but the device memory it is given.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from kernels.spec import Problem

MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024

_LAUNCH = re.compile(
    r"^\s*//\s*kf-launch:\s*(?P<kernel>[A-Za-z_]\w*)\s*\((?P<args>[^)]*)\)"
    r"\s+grid=(?P<grid>\(.*?\))\s+block=(?P<block>\(.*?\))(?:\s+smem=(?P<smem>\S+))?\s*$"
)
_BUFFER = re.compile(r"^\s*//\s*kf-buffer:\s*(?P<name>[A-Za-z_]\w*)\s+bytes=(?P<bytes>\S+)\s*$")
_MARK = re.compile(r"^\s*//\s*kf-(launch|buffer)\b")
_FUNCTIONS = {"cdiv", "min", "max"}


class LaunchError(ValueError):
    """A source whose launch lines are missing or malformed: says which line and why."""


@dataclass(frozen=True)
class Expr:
    """An integer size expression over the dims, checked when parsed."""

    text: str
    tree: ast.expr = field(compare=False, hash=False)

    def value(self, dims: Mapping[str, int]) -> int:
        return _evaluate(self.tree, dims)


@dataclass(frozen=True)
class Buffer:
    name: str
    nbytes: Expr


@dataclass(frozen=True)
class Launch:
    kernel: str
    args: tuple[str, ...]
    grid: tuple[Expr, ...]
    block: tuple[Expr, ...]
    shared_bytes: Expr


@dataclass(frozen=True)
class ResolvedLaunch:
    """One launch with every size computed for a shape."""

    kernel: str
    args: tuple[str, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int


@dataclass(frozen=True)
class LaunchPlan:
    buffers: tuple[Buffer, ...]
    launches: tuple[Launch, ...]

    @property
    def kernels(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(launch.kernel for launch in self.launches))

    def buffer_bytes(self, dims: Mapping[str, int]) -> dict[str, int]:
        sizes = {b.name: b.nbytes.value(dims) for b in self.buffers}
        for name, size in sizes.items():
            if size < 0:
                raise LaunchError(f"buffer {name} has a negative size ({size}) at {dict(dims)}")
        return sizes

    def resolve(self, dims: Mapping[str, int]) -> tuple[ResolvedLaunch, ...]:
        """Every launch's sizes at one shape, checked against the hardware's launch limits."""
        resolved = []
        for launch in self.launches:
            grid = _padded(tuple(e.value(dims) for e in launch.grid))
            block = _padded(tuple(e.value(dims) for e in launch.block))
            shared = launch.shared_bytes.value(dims)
            where = f"{launch.kernel} at {dict(dims)}"
            for axis, (g, most) in enumerate(zip(grid, MAX_GRID, strict=True)):
                if not 1 <= g <= most:
                    raise LaunchError(f"{where}: grid[{axis}] = {g} is outside 1..{most}")
            for axis, (b, most) in enumerate(zip(block, MAX_BLOCK, strict=True)):
                if not 1 <= b <= most:
                    raise LaunchError(f"{where}: block[{axis}] = {b} is outside 1..{most}")
            threads = block[0] * block[1] * block[2]
            if threads > MAX_THREADS_PER_BLOCK:
                raise LaunchError(f"{where}: {threads} threads per block (at most 1024)")
            if shared < 0:
                raise LaunchError(f"{where}: negative shared memory ({shared} bytes)")
            resolved.append(ResolvedLaunch(launch.kernel, launch.args, grid, block, shared))
        return tuple(resolved)

    def render(self) -> str:
        """The comment lines that declare this plan (for generators)."""
        lines = [f"// kf-buffer: {b.name} bytes={_compact(b.nbytes.text)}" for b in self.buffers]
        for launch in self.launches:
            grid = ", ".join(e.text for e in launch.grid)
            block = ", ".join(e.text for e in launch.block)
            lines.append(
                f"// kf-launch: {launch.kernel}({', '.join(launch.args)}) grid=({grid}) "
                f"block=({block}) smem={_compact(launch.shared_bytes.text)}"
            )
        return "\n".join(lines) + "\n"


def launch(
    kernel: str,
    args: tuple[str, ...],
    grid: tuple[str, ...] | str,
    block: tuple[str, ...] | str | int,
    shared_bytes: str | int = 0,
) -> Launch:
    """A launch built from expression texts (for generators; parse-checked like a source)."""
    grids = (grid,) if isinstance(grid, str) else grid
    blocks = (str(block),) if isinstance(block, str | int) else block
    return Launch(
        kernel,
        tuple(args),
        tuple(_expr(g, "grid") for g in grids),
        tuple(_expr(str(b), "block") for b in blocks),
        _expr(str(shared_bytes), "smem"),
    )


def buffer(name: str, nbytes: str) -> Buffer:
    return Buffer(name, _expr(nbytes, "bytes"))


def parse_launch_plan(source: str, problem: Problem) -> LaunchPlan:
    """The plan declared in `source`, checked against the problem's arguments and dims."""
    buffers: list[Buffer] = []
    launches: list[Launch] = []
    for number, line in enumerate(source.splitlines(), start=1):
        if not _MARK.match(line):
            continue
        where = f"line {number}"
        if (m := _BUFFER.match(line)) is not None:
            buffers.append(Buffer(m["name"], _expr(m["bytes"], f"{where} bytes")))
        elif (m := _LAUNCH.match(line)) is not None:
            args = tuple(a.strip() for a in m["args"].split(",") if a.strip())
            launches.append(
                Launch(
                    m["kernel"],
                    args,
                    _exprs(m["grid"], f"{where} grid"),
                    _exprs(m["block"], f"{where} block"),
                    _expr(m["smem"] or "0", f"{where} smem"),
                )
            )
        else:
            raise LaunchError(
                f"{where}: cannot read {line.strip()!r}; expected "
                "'// kf-launch: NAME(ARGS) grid=(...) block=(...) [smem=BYTES]' or "
                "'// kf-buffer: NAME bytes=EXPR'"
            )
    plan = LaunchPlan(tuple(buffers), tuple(launches))
    check_plan(plan, problem)
    return plan


def check_plan(plan: LaunchPlan, problem: Problem) -> None:
    """Names resolve, every size uses only the problem's dims, every output is written."""
    if not plan.launches:
        raise LaunchError(
            "the source declares no launch: add a line like "
            "'// kf-launch: my_kernel(x, y, rows, cols) grid=(rows) block=(256)'"
        )
    dims = set(problem.dims)
    arg_names = {a.name for a in problem.args}
    buffer_names = [b.name for b in plan.buffers]
    clash = (set(buffer_names) & (arg_names | dims)) | {
        n for n in buffer_names if buffer_names.count(n) > 1
    }
    if clash:
        raise LaunchError(f"buffer names clash with arguments, dims or each other: {sorted(clash)}")
    known = arg_names | dims | set(buffer_names)
    exprs = [b.nbytes for b in plan.buffers]
    for launch in plan.launches:
        unknown = [a for a in launch.args if a not in known]
        if unknown:
            raise LaunchError(
                f"{launch.kernel}: unknown arguments {unknown}; known: problem arguments "
                f"{sorted(arg_names)}, dims {sorted(dims)}, buffers {buffer_names}"
            )
        if not 1 <= len(launch.grid) <= 3 or not 1 <= len(launch.block) <= 3:
            raise LaunchError(f"{launch.kernel}: grid and block take one to three values")
        exprs += [*launch.grid, *launch.block, launch.shared_bytes]
    for expr in exprs:
        names = {n.id for n in ast.walk(expr.tree) if isinstance(n, ast.Name)} - _FUNCTIONS
        if names - dims:
            raise LaunchError(
                f"size {expr.text!r} uses {sorted(names - dims)}; only dims {sorted(dims)}"
            )
    passed = {a for launch in plan.launches for a in launch.args}
    unwritten = [a.name for a in problem.outputs if a.name not in passed]
    if unwritten:
        raise LaunchError(f"no launch is given the outputs {unwritten}")


def _padded(values: tuple[int, ...]) -> tuple[int, int, int]:
    padded = (*values, 1, 1)[:3]
    return (padded[0], padded[1], padded[2])


def _compact(text: str) -> str:
    return text.replace(" ", "")


def _exprs(text: str, what: str) -> tuple[Expr, ...]:
    inner = text.strip()
    if not (inner.startswith("(") and inner.endswith(")")):
        raise LaunchError(f"{what}: {text!r} must be in parentheses")
    parts = _split_top_level(inner[1:-1])
    if not parts:
        raise LaunchError(f"{what}: {text!r} is empty")
    return tuple(_expr(p, what) for p in parts)


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _expr(text: str, what: str) -> Expr:
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise LaunchError(f"{what}: {text!r} is not an expression ({exc.msg})") from None
    callees = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in _FUNCTIONS and id(node) not in callees:
            raise LaunchError(f"{what}: {text!r} uses {node.id} without calling it")
        allowed = isinstance(
            node,
            ast.Constant
            | ast.Name
            | ast.BinOp
            | ast.Call
            | ast.Load
            | ast.Add
            | ast.Sub
            | ast.Mult
            | ast.FloorDiv
            | ast.Mod
            | ast.UnaryOp
            | ast.USub,
        )
        if isinstance(node, ast.Constant) and type(node.value) is not int:
            allowed = False
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords
        ):
            allowed = False
        if not allowed:
            raise LaunchError(
                f"{what}: {text!r} may use only integers, dims, + - * // % and cdiv(), min(), max()"
            )
    return Expr(text.strip(), tree)


def _evaluate(node: ast.expr, dims: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return int(dims[node.id])
    if isinstance(node, ast.UnaryOp):
        return -_evaluate(node.operand, dims)
    if isinstance(node, ast.BinOp):
        a, b = _evaluate(node.left, dims), _evaluate(node.right, dims)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if b == 0:
            raise LaunchError("division by zero in a launch size")
        return a // b if isinstance(node.op, ast.FloorDiv) else a % b
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        values = [_evaluate(arg, dims) for arg in node.args]
        if node.func.id == "cdiv":
            if len(values) != 2 or values[1] == 0:
                raise LaunchError("cdiv takes two arguments, the second non-zero")
            return -(-values[0] // values[1])
        if not values:
            raise LaunchError(f"{node.func.id}() needs arguments")
        return min(values) if node.func.id == "min" else max(values)
    raise LaunchError(f"cannot evaluate {ast.dump(node)}")
