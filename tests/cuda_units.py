"""Compiling many rendered CUDA points for sm_90 in few nvcc calls, for the template tests.

One nvcc call per point would take minutes, so points sharing their flags go into one
translation unit of up to UNIT_POINTS points: `#include`s hoisted to the top, each point's
source in its own namespace `kf_point_<i>` with its `extern "C"` kernels renamed
`<name>__kfp<i>`. The units compile in parallel nvcc calls. A unit that fails is split in
halves until the failing points are found (at most MOST_FAILURES per unit), so a failure
names its point. Each point's kernels and device functions, as ptxas reports them
(`gpu_workers.cuda.ptxas.parse_ptxas_report`), come back under their own names.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest

from gpu_workers.cuda.ptxas import KernelResources, parse_ptxas_report
from kernels.design_space import ParamValue, Template

ARCH = "sm_90"
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(
    NVCC is None, reason="nvcc is not on PATH: compiling CUDA templates needs the CUDA toolkit"
)
UNIT_POINTS = 36
"""Points per nvcc call: large enough to amortise nvcc's start, small enough to balance."""
MOST_FAILURES = 3
"""Failing points a failing unit is bisected down to before the rest are left unnamed."""

_KERNEL = re.compile(
    r'extern\s+"C"\s+__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\([^)]*\)\s*)?'
    r"(?:void\s+)?(\w+)\s*\("
)
_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b.*$", re.MULTILINE)
_RENAMED = re.compile(r"^(?P<name>\w+)__kfp(?P<index>\d+)$")
_NAMESPACED = re.compile(r"_ZN(?P<length>\d+)kf_point_")
"""A device function's mangled name in `kf_point_<i>`: `_ZN10kf_point_3...` (the length
says where the index ends: `_ZN11kf_point_124fooEv` is `foo` in `kf_point_12`)."""

K = TypeVar("K")


def kernel_names(source: str) -> list[str]:
    """The `extern "C" __global__` kernels a source defines, in order."""
    return _KERNEL.findall(source)


@dataclass(frozen=True)
class PointSource:
    """One rendered point of a design space, to compile."""

    space: str
    dtype: str
    params: Mapping[str, ParamValue]
    source: str
    flags: tuple[str, ...]

    @classmethod
    def render(cls, space: Template, params: Mapping[str, ParamValue], dtype: str) -> PointSource:
        rendered = space.render(dict(params), dtype)
        return cls(space.name, dtype, params, rendered.source, rendered.flags)

    def describe(self) -> str:
        return f"{self.space} {self.dtype} {dict(self.params)}"


@dataclass(frozen=True)
class Compiled:
    point: PointSource
    error: str | None
    """None where the point compiled (in its unit); else why not (nvcc's errors)."""
    functions: tuple[KernelResources, ...] = ()
    """Its kernels (under their own names) and non-inlined device functions."""

    def problems(self, *, spills: bool = True) -> list[str]:
        """What is wrong: it does not compile, ptxas did not report one of its kernels, or
        (with `spills`) a function of it spills registers, which the static stage refuses."""
        where = self.point.describe()
        if self.error is not None:
            return [f"{where}: {self.error}"]
        entries = {f.kernel for f in self.functions if f.entry}
        found = [
            f"{where}: ptxas reported no kernel {name}"
            for name in kernel_names(self.point.source)
            if name not in entries
        ]
        if spills:
            found += [
                f"{where}: {f.kernel} spills ({f.spill_store_bytes} bytes stored, "
                f"{f.spill_load_bytes} loaded)"
                for f in self.functions
                if f.spill_store_bytes or f.spill_load_bytes
            ]
        return found


def assert_compiled(results: Iterable[Compiled], *, spills: bool = True) -> None:
    problems = [p for r in results for p in r.problems(spills=spills)]
    assert not problems, "points that do not compile cleanly for sm_90:\n" + "\n".join(problems)


def unit_source(sources: Sequence[str]) -> str:
    """One translation unit for many sources: includes hoisted to the top, each source in
    namespace `kf_point_<i>` with its `extern "C"` kernels renamed `<name>__kfp<i>`."""
    includes = dict.fromkeys(m.group(0).strip() for s in sources for m in _INCLUDE.finditer(s))
    parts = list(includes)
    for index, source in enumerate(sources):
        body = _INCLUDE.sub("", source)
        for name in dict.fromkeys(kernel_names(body)):
            body = re.sub(rf"\b{name}\b", f"{name}__kfp{index}", body)
        parts.append(f"namespace kf_point_{index} {{\n{body}\n}}  // namespace kf_point_{index}")
    return "\n".join(parts) + "\n"


def _nvcc(sources: Sequence[str], flags: tuple[str, ...], path: Path) -> tuple[bool, str]:
    assert NVCC is not None, "nvcc is not on PATH"
    path.write_text(unit_source(sources))
    command = [NVCC, "-cubin", f"-arch={ARCH}", "-Xptxas", "-v", *flags, path.name]
    done = subprocess.run(
        [*command, "-o", path.with_suffix(".cubin").name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done.returncode == 0, done.stdout + done.stderr


def _by_slot(log: str) -> dict[int, list[KernelResources]]:
    """The functions of a unit's ptxas report, by the slot (namespace) of their point."""
    slots: dict[int, list[KernelResources]] = {}
    for function in parse_ptxas_report(log):
        renamed = _RENAMED.match(function.kernel)
        if renamed is not None:
            index = int(renamed["index"])
            function = msgspec.structs.replace(function, kernel=renamed["name"])
        elif (mangled := _NAMESPACED.match(function.kernel)) is not None:
            digits = int(mangled["length"]) - len("kf_point_")
            index = int(function.kernel[mangled.end() : mangled.end() + digits])
        else:
            continue
        slots.setdefault(index, []).append(function)
    return slots


def _errors(log: str) -> str:
    lines = [line for line in log.splitlines() if "error" in line]
    return "\n".join(lines[:5]) if lines else log[-3000:]


def _compile_unit(points: Sequence[PointSource], path: Path) -> list[Compiled]:
    """Points sharing flags as one unit; where it fails, bisected to name failing points."""
    outcomes: dict[int, Compiled] = {}
    failures = 0

    def build(indices: list[int], label: str) -> None:
        nonlocal failures
        if failures >= MOST_FAILURES:
            for i in indices:
                outcomes[i] = Compiled(
                    points[i], f"not compiled alone: bisection stopped at {failures} failures"
                )
            return
        target = path.with_name(f"{path.stem}{label}.cu")
        ok, log = _nvcc([points[i].source for i in indices], points[indices[0]].flags, target)
        if ok:
            slots = _by_slot(log)
            for slot, i in enumerate(indices):
                outcomes[i] = Compiled(points[i], None, tuple(slots.get(slot, ())))
            return
        if len(indices) == 1:
            failures += 1
            outcomes[indices[0]] = Compiled(points[indices[0]], _errors(log))
            return
        half = len(indices) // 2
        build(indices[:half], label + "a")
        build(indices[half:], label + "b")
        if all(outcomes[i].error is None for i in indices):
            for i in indices:  # each half compiles: only the points together fail
                outcomes[i] = Compiled(points[i], f"fails only in its unit:\n{log[-3000:]}")

    build(list(range(len(points))), "")
    return [outcomes[i] for i in range(len(points))]


def _units(points: Sequence[PointSource]) -> list[list[int]]:
    """Indices of `points` in units of points sharing flags, as even as UNIT_POINTS allows."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for index, point in enumerate(points):
        groups.setdefault(point.flags, []).append(index)
    units = []
    for members in groups.values():
        size = -(-len(members) // -(-len(members) // UNIT_POINTS))
        units += [members[start : start + size] for start in range(0, len(members), size)]
    return units


def compile_points(
    cases: Mapping[K, Sequence[PointSource]], folder: Path
) -> dict[K, list[Compiled]]:
    """Every point of every case compiled for sm_90 in units on all cores; by case, in order."""
    flat = [(case, point) for case, points in cases.items() for point in points]
    units = _units([point for _, point in flat])
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with ThreadPoolExecutor(max_workers=workers or 1) as pool:
        done = pool.map(
            lambda n: _compile_unit([flat[i][1] for i in units[n]], folder / f"unit{n}.cu"),
            range(len(units)),
        )
        outcomes: dict[int, Compiled] = {}
        for unit, compiled in zip(units, done, strict=True):
            outcomes.update(zip(unit, compiled, strict=True))
    results: dict[K, list[Compiled]] = {case: [] for case in cases}
    for index, (case, _) in enumerate(flat):
        results[case].append(outcomes[index])
    return results
