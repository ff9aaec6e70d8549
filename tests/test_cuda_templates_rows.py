"""The CUDA templates for softmax, rmsnorm, layernorm, gelu and KDA.

Every point of every design space renders for every dtype and declares a launch plan that
resolves at every test shape and the default shape. With nvcc, every point compiles for
sm_90 (all points in bf16, the defaults and best known points in fp32 and fp16; `-m slow`
compiles every point in every dtype) without spilling, which the static stage would refuse.
To stay fast, up to BATCH_POINTS points sharing a dtype and flags compile as one translation
unit, each in its own namespace with its kernels renamed, in parallel nvcc calls; a failing
batch is bisected to name the failing point. Nothing here runs a kernel, so nothing checks
numbers: the templates' comments argue their indexing and numerics.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernels.builtin import BUILTIN
from kernels.cuda_launch import parse_launch_plan
from kernels.cuda_templates.rows import ROW_TEMPLATES
from kernels.design_space import CUDA_TYPES, TARGET_DTYPES, ParamValue, Template
from kernels.templates import TEMPLATES

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(
    NVCC is None, reason="nvcc is not on PATH: compiling CUDA templates needs the CUDA toolkit"
)
ARCH = "sm_90"
DTYPES = TARGET_DTYPES["cuda"]
BATCH_POINTS = 36
"""Points per nvcc call: large enough to amortise nvcc's start, small enough to balance."""

Point = dict[str, ParamValue]

_KERNEL = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\('
)
_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b.*$", re.MULTILINE)
_PROPERTIES = re.compile(
    r"Function properties for (\w+)\s*\n\s*\d+ bytes stack frame, "
    r"(\d+) bytes spill stores, (\d+) bytes spill loads"
)


def _ids(template: Template) -> str:
    return template.name


def _shapes(template: Template) -> list[dict[str, int]]:
    problem = BUILTIN[template.problem]
    return [*problem.test_shapes, problem.default_shape]


def test_spaces_are_modest_and_anchored() -> None:
    names = [t.name for t in ROW_TEMPLATES]
    assert names == [
        "softmax_cuda_rows",
        "rmsnorm_cuda_rows",
        "layernorm_cuda_rows",
        "gelu_cuda_stream",
        "kda_cuda_recurrent",
    ]
    for template in ROW_TEMPLATES:
        size = sum(1 for _ in template.valid_points())
        assert 20 <= size <= 160, (template.name, size)
        assert template.target == "cuda" and template.problem in BUILTIN
        assert template.is_valid(template.defaults), template.violations(template.defaults)
        assert template.is_valid(template.best_known), template.violations(template.best_known)
        assert TEMPLATES[template.name] is template
        for flags in template.space()["flags"]:
            assert "-arch" not in str(flags) and "-code" not in str(flags)


@pytest.mark.parametrize("template", ROW_TEMPLATES, ids=_ids)
def test_every_point_renders_and_its_launch_plan_resolves(template: Template) -> None:
    problem = BUILTIN[template.problem]
    shapes = _shapes(template)
    for dtype in DTYPES:
        for point in template.valid_points():
            rendered = template.render(point, dtype)
            source = rendered.source
            where = f"{template.name} {dtype} {point}"
            assert f"typedef {CUDA_TYPES[dtype]} kf_t;" in source, where
            assert rendered.flags == tuple(str(point["flags"]).split()), where
            assert "atomic" not in source, f"{where}: outputs must not depend on atomics' order"
            plan = parse_launch_plan(source, problem)
            declared = set(_KERNEL.findall(source))
            assert set(plan.kernels) <= declared, (where, plan.kernels, declared)
            for shape in shapes:
                plan.resolve(shape)
                plan.buffer_bytes(shape)


def test_vector_points_guard_their_fast_path() -> None:
    """A 16-byte path runs only where cols (or the pointers) allow it: the guard is in the
    source, and the scalar fallback is instantiated beside it."""
    for template in ROW_TEMPLATES[:4]:
        point = {**template.defaults, "vector": "vec16"}
        source = template.render(point, "bf16").source
        assert "<1>(" in source and "<KF_VEC16>(" in source, template.name
        if template.problem != "gelu":
            assert "cols % KF_VEC16 == 0" in source, template.name


# Compiling ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    template: Template
    point: Point

    def describe(self, dtype: str) -> str:
        return f"{self.template.name} {dtype} {self.point}"


@dataclass(frozen=True)
class Batch:
    """Points of any templates sharing a dtype and flags: one nvcc call."""

    dtype: str
    flags: str
    items: tuple[Item, ...]

    def sources(self, indices: Sequence[int]) -> list[str]:
        return [
            self.items[i].template.render(self.items[i].point, self.dtype).source for i in indices
        ]


@dataclass(frozen=True)
class Compiled:
    batch: Batch
    returncode: int
    log: str
    spills: dict[int, tuple[int, int]]
    """Item index -> (spill store bytes, spill load bytes), over the item's kernels."""


def batch_source(sources: Sequence[str]) -> str:
    """One translation unit for many sources: includes hoisted to the top, each source in
    namespace `kf_point_<i>` with its `extern "C"` kernels renamed `<name>__kfp<i>`."""
    includes = dict.fromkeys(m.group(0).strip() for s in sources for m in _INCLUDE.finditer(s))
    parts = list(includes)
    for index, source in enumerate(sources):
        body = _INCLUDE.sub("", source)
        for name in _KERNEL.findall(body):
            body = re.sub(rf"\b{name}\b", f"{name}__kfp{index}", body)
        parts.append(f"namespace kf_point_{index} {{\n{body}\n}}  // namespace kf_point_{index}")
    return "\n".join(parts) + "\n"


def _nvcc(sources: Sequence[str], flags: str, path: Path) -> subprocess.CompletedProcess[str]:
    assert NVCC is not None
    path.write_text(batch_source(sources))
    command = [NVCC, "-cubin", f"-arch={ARCH}", "-Xptxas", "-v", *flags.split(), str(path)]
    return subprocess.run(
        [*command, "-o", str(path.with_suffix(".cubin"))],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _compile(batch: Batch, path: Path) -> Compiled:
    done = _nvcc(batch.sources(range(len(batch.items))), batch.flags, path)
    log = done.stdout + done.stderr
    spills: dict[int, tuple[int, int]] = {}
    for kernel, stores, loads in _PROPERTIES.findall(log):
        found = re.search(r"__kfp(\d+)$", kernel)
        if found is not None:
            index = int(found.group(1))
            before = spills.get(index, (0, 0))
            spills[index] = (before[0] + int(stores), before[1] + int(loads))
    return Compiled(batch, done.returncode, log, spills)


def _failing_points(batch: Batch, path: Path, most: int = 3) -> list[str]:
    """Bisect a batch that does not compile down to (at most `most`) failing points."""
    found: list[str] = []

    def search(indices: list[int]) -> None:
        if len(found) >= most:
            return
        done = _nvcc(batch.sources(indices), batch.flags, path)
        if done.returncode == 0:
            return
        if len(indices) == 1:
            errors = [line for line in done.stderr.splitlines() if "error" in line]
            found.append(f"{batch.items[indices[0]].describe(batch.dtype)}: {errors[:5]}")
            return
        half = len(indices) // 2
        search(indices[:half])
        search(indices[half:])

    search(list(range(len(batch.items))))
    return found


def _points(template: Template, dtype: str, every: bool) -> list[Point]:
    if every or dtype == "bf16":
        return list(template.valid_points())
    if template.best_known == template.defaults:
        return [template.defaults]
    return [template.defaults, template.best_known]


def _batches(every: bool) -> list[Batch]:
    groups: dict[tuple[str, str], list[Item]] = {}
    for dtype in DTYPES:
        for template in ROW_TEMPLATES:
            for point in _points(template, dtype, every):
                groups.setdefault((dtype, str(point["flags"])), []).append(Item(template, point))
    batches = []
    for (dtype, flags), items in groups.items():
        count = -(-len(items) // BATCH_POINTS)
        size = -(-len(items) // count)
        for start in range(0, len(items), size):
            batches.append(Batch(dtype, flags, tuple(items[start : start + size])))
    return batches


Results = dict[tuple[str, str], list[tuple[Compiled, int]]]
"""(template name, dtype) -> each of its points as (its batch's result, its index there)."""


def _compile_all(root: Path, every: bool) -> Results:
    batches = _batches(every)
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with ThreadPoolExecutor(max_workers=workers or 1) as pool:
        compiled = list(
            pool.map(lambda ib: _compile(ib[1], root / f"batch{ib[0]}.cu"), enumerate(batches))
        )
    results: Results = {}
    for item in compiled:
        for index, entry in enumerate(item.batch.items):
            key = (entry.template.name, item.batch.dtype)
            results.setdefault(key, []).append((item, index))
    return results


def _check(results: Sequence[tuple[Compiled, int]], root: Path) -> None:
    failures: list[str] = []
    spilled: list[str] = []
    bisected: set[int] = set()
    for item, index in results:
        if item.returncode != 0:
            if id(item) not in bisected:
                bisected.add(id(item))
                failures += _failing_points(item.batch, root / "bisect.cu") or [
                    f"a batch fails but no single point does:\n{item.log[-3000:]}"
                ]
            continue
        assert index in item.spills, f"no ptxas report for {item.batch.items[index]}"
        stores, loads = item.spills[index]
        if stores or loads:
            entry = item.batch.items[index].describe(item.batch.dtype)
            spilled.append(f"{entry}: {stores} bytes spill stores, {loads} loads")
    assert not failures, "points that do not compile:\n" + "\n".join(failures)
    assert not spilled, "points that spill (the static stage refuses them):\n" + "\n".join(spilled)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Results:
    return _compile_all(tmp_path_factory.mktemp("cuda_rows"), every=False)


@needs_nvcc
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("template", ROW_TEMPLATES, ids=_ids)
def test_points_compile_for_sm90_without_spills(
    template: Template, dtype: str, compiled: Results, tmp_path: Path
) -> None:
    results = compiled[(template.name, dtype)]
    compiled_points = sorted(repr(r.batch.items[i].point) for r, i in results)
    assert compiled_points == sorted(map(repr, _points(template, dtype, False)))
    _check(results, tmp_path)


@needs_nvcc
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("template", ROW_TEMPLATES, ids=_ids)
def test_best_known_points_do_not_spill(template: Template, dtype: str, compiled: Results) -> None:
    best = [
        (r, i)
        for r, i in compiled[(template.name, dtype)]
        if r.batch.items[i].point == template.best_known
    ]
    assert len(best) == 1, f"{template.name} {dtype}: the best known point was not compiled"
    item, index = best[0]
    assert item.returncode == 0, item.log[-3000:]
    assert item.spills[index] == (0, 0), (template.name, dtype, item.spills[index])


@needs_nvcc
@pytest.mark.slow
def test_every_point_compiles_in_every_dtype(tmp_path: Path) -> None:
    results = _compile_all(tmp_path, every=True)
    _check([entry for entries in results.values() for entry in entries], tmp_path)
