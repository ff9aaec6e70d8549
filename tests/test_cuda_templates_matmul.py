"""The CUDA matmul templates and the cuda fusion space: every valid point, in every dtype
it takes, renders a source whose launch plan resolves at every test shape, and compiles
for sm_90; the hand-picked best points compile without spilling registers.

Compiling ~700 kernels one by one would take minutes, so the points of one (space, dtype,
flags) go into a few translation units: each point's source in its own namespace, its
kernels renamed with a unique suffix, its #includes hoisted to the top. A unit that fails
is split in halves until the failing point is found, and the assertion names it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernels.builtin import BUILTIN
from kernels.cuda_launch import parse_launch_plan
from kernels.design_space import InvalidParams, ParamValue, Template
from kernels.fusion import fusion_space
from kernels.templates import TEMPLATES, templates_for

ARCH = "sm_90"
DTYPES = ("fp32", "bf16", "fp16")
FUSED = BUILTIN["residual_rmsnorm_gelu"]
SPACES: dict[str, tuple[Template, str]] = {
    "matmul_cuda_tiled": (TEMPLATES["matmul_cuda_tiled"], "matmul"),
    "matmul_cuda_tensorcore": (TEMPLATES["matmul_cuda_tensorcore"], "matmul"),
    "fusion": (fusion_space(FUSED, f"cuda:{ARCH}"), "residual_rmsnorm_gelu"),
}
POINTS_PER_UNIT = 40
"""Points per translation unit: large enough that nvcc's fixed cost (headers, start-up) is
paid rarely, small enough that the units spread over the cores."""

_KERNEL = re.compile(r'(extern "C" __global__\b[^{;]*?\b)(kf_\w+)(\s*\()')
_PROPERTIES = re.compile(
    r"Function properties for (\w+)\s+(\d+) bytes stack frame, (\d+) bytes spill stores, "
    r"(\d+) bytes spill loads"
)
_COMPILED = re.compile(r"Compiling entry function '(\w+)'")


def _cases() -> Iterator[tuple[str, str]]:
    for name, (space, _) in SPACES.items():
        for dtype in DTYPES:
            if space.accepts(dtype):
                yield name, dtype


CASES = list(_cases())


# rendering ------------------------------------------------------------------------------


def test_the_matmul_templates_are_registered_for_cuda() -> None:
    names = {t.name for t in templates_for("matmul", "cuda")}
    assert names == {"matmul_cuda_tiled", "matmul_cuda_tensorcore"}
    for name in names:
        template = TEMPLATES[name]
        count = sum(1 for _ in template.valid_points())
        assert 20 <= count <= 150, (name, count)
        assert template.is_valid(template.defaults), template.violations(template.defaults)
        assert template.is_valid(template.best_known), template.violations(template.best_known)
        assert {str(c) for c in template.space()["flags"]} == {"-O3", "-O3 --use_fast_math"}


def test_the_tensor_core_template_takes_16_bit_types_only() -> None:
    template = TEMPLATES["matmul_cuda_tensorcore"]
    assert [d for d in DTYPES if template.accepts(d)] == ["bf16", "fp16"]
    with pytest.raises(InvalidParams, match="fp32"):
        template.render(template.best_known, "fp32")
    assert all(TEMPLATES["matmul_cuda_tiled"].accepts(d) for d in DTYPES)


@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_every_point_renders_a_launch_plan_that_resolves_at_every_shape(
    name: str, dtype: str
) -> None:
    space, problem_name = SPACES[name]
    problem = BUILTIN[problem_name]
    shapes = [*problem.test_shapes, problem.default_shape]
    element = {"fp32": "float", "bf16": "__nv_bfloat16", "fp16": "__half"}[dtype]
    count = 0
    for point in space.valid_points():
        rendered = space.render(point, dtype)
        where = f"{name} {dtype} {point}"
        assert rendered.flags == tuple(str(point["flags"]).split()), where
        assert not any(f.startswith(("-arch", "--gpu-architecture")) for f in rendered.flags)
        assert f"typedef {element} kf_t;" in rendered.source, where
        plan = parse_launch_plan(rendered.source, problem)
        defined = {m[2] for m in _KERNEL.finditer(rendered.source)}
        assert set(plan.kernels) <= defined, (where, plan.kernels, defined)
        for shape in shapes:
            resolved = plan.resolve(shape)
            assert all(r.shared_bytes == 0 for r in resolved), where  # static smem only
            assert all(size > 0 for size in plan.buffer_bytes(shape).values()), where
        count += 1
    assert count > 0


def test_sources_differ_between_points_and_are_pure() -> None:
    for name, dtype in CASES:
        space, _ = SPACES[name]
        seen: dict[tuple[str, tuple[str, ...]], dict[str, ParamValue]] = {}
        for point in space.valid_points():
            first = space.render(point, dtype)
            assert space.render(dict(reversed(list(point.items()))), dtype) == first
            key = (first.source, first.flags)
            assert key not in seen, (name, dtype, point, seen.get(key))
            seen[key] = point


# compiling ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    point: dict[str, ParamValue]
    source: str
    kernels: tuple[str, ...]


@dataclass(frozen=True)
class Built:
    ok: bool
    log: str
    failing: Member | None
    """With `ok` false: the first point that fails on its own."""


def _unit(members: list[Member]) -> str:
    includes: list[str] = []
    bodies: list[str] = []
    for index, member in enumerate(members):
        rest = []
        for line in member.source.splitlines():
            if line.lstrip().startswith("#include"):
                if line.strip() not in includes:
                    includes.append(line.strip())
            else:
                rest.append(line)
        body = _KERNEL.sub(rf"\g<1>\g<2>__p{index}\g<3>", "\n".join(rest))
        bodies.append(f"namespace kf_point{index} {{\n{body}\n}}\n")
    return "\n".join([*includes, "", *bodies])


def _nvcc(
    nvcc: str, folder: Path, label: str, flags: tuple[str, ...], source: str
) -> tuple[bool, str]:
    path = folder / f"{label}.cu"
    path.write_text(source)
    command = [nvcc, "-cubin", f"-arch={ARCH}", "-Xptxas", "-v", *flags, path.name]
    done = subprocess.run(
        [*command, "-o", f"{label}.cubin"], cwd=folder, capture_output=True, text=True, timeout=300
    )
    return done.returncode == 0, done.stdout + done.stderr


def _build(
    nvcc: str, folder: Path, label: str, flags: tuple[str, ...], members: list[Member]
) -> Built:
    ok, log = _nvcc(nvcc, folder, label, flags, _unit(members))
    if ok or len(members) == 1:
        return Built(ok, log, None if ok else members[0])
    half = len(members) // 2
    for part, group in (("a", members[:half]), ("b", members[half:])):
        built = _build(nvcc, folder, label + part, flags, group)
        if not built.ok:
            return built
    return Built(False, log, None)  # fails only together: the unit's log says why


@pytest.fixture(scope="module")
def builds(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[tuple[str, str], list[tuple[list[Member], Built]]]:
    """Every valid point of every case, compiled in units on all cores."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed on this host: the CUDA sources cannot be compiled")
    folder = tmp_path_factory.mktemp("cuda_units")
    jobs: list[tuple[tuple[str, str], str, tuple[str, ...], list[Member]]] = []
    for name, dtype in CASES:
        space, problem_name = SPACES[name]
        by_flags: dict[tuple[str, ...], list[Member]] = {}
        for point in space.valid_points():
            rendered = space.render(point, dtype)
            kernels = parse_launch_plan(rendered.source, BUILTIN[problem_name]).kernels
            by_flags.setdefault(rendered.flags, []).append(Member(point, rendered.source, kernels))
        for f, (flags, members) in enumerate(by_flags.items()):
            for start in range(0, len(members), POINTS_PER_UNIT):
                label = f"{name}_{dtype}_f{f}_{start}"
                jobs.append(((name, dtype), label, flags, members[start : start + POINTS_PER_UNIT]))
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with ThreadPoolExecutor(max_workers=workers or 1) as pool:
        futures = [
            (case, members, pool.submit(_build, nvcc, folder, label, flags, members))
            for case, label, flags, members in jobs
        ]
        results: dict[tuple[str, str], list[tuple[list[Member], Built]]] = {}
        for case, members, future in futures:
            results.setdefault(case, []).append((members, future.result()))
    return results


@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_every_point_compiles_for_sm_90(
    name: str, dtype: str, builds: dict[tuple[str, str], list[tuple[list[Member], Built]]]
) -> None:
    compiled = 0
    for members, built in builds[(name, dtype)]:
        if not built.ok:
            point = built.failing.point if built.failing else "(only the whole unit)"
            pytest.fail(f"{name} {dtype}: nvcc fails at {point}:\n{built.log[-4000:]}")
        entries = set(_COMPILED.findall(built.log))
        for index, member in enumerate(members):
            missing = {f"{k}__p{index}" for k in member.kernels} - entries
            assert not missing, (name, dtype, member.point, missing)
            compiled += 1
    space, _ = SPACES[name]
    assert compiled == sum(1 for _ in space.valid_points())


@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_the_best_points_do_not_spill(
    name: str, dtype: str, builds: dict[tuple[str, str], list[tuple[list[Member], Built]]]
) -> None:
    space, _ = SPACES[name]
    checked = 0
    for members, built in builds[(name, dtype)]:
        spills = {m[1]: (int(m[3]), int(m[4])) for m in _PROPERTIES.finditer(built.log)}
        for index, member in enumerate(members):
            if member.point != space.best_known:
                continue
            for kernel in member.kernels:
                assert spills[f"{kernel}__p{index}"] == (0, 0), (name, dtype, kernel, spills)
                checked += 1
    assert checked > 0
