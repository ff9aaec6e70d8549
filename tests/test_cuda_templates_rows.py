"""The CUDA templates for softmax, rmsnorm, layernorm, gelu and KDA.

Every point of every design space renders for every dtype and declares a launch plan that
resolves at every test shape and the default shape. With nvcc, every point compiles for
sm_90 (all points in bf16, the defaults and best known points in fp32 and fp16; `-m slow`
compiles every point in every dtype) without spilling, which the static stage would refuse.
The points compile in shared translation units (tests/cuda_units.py); a failing unit is
bisected to name the failing point. Nothing here runs a kernel, so nothing checks numbers:
the templates' comments argue their indexing and numerics.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels.builtin import BUILTIN
from kernels.cuda_launch import parse_launch_plan
from kernels.cuda_templates.rows import ROW_TEMPLATES
from kernels.design_space import CUDA_TYPES, TARGET_DTYPES, ParamValue, Template
from kernels.templates import TEMPLATES
from tests.cuda_units import (
    Compiled,
    PointSource,
    assert_compiled,
    compile_points,
    kernel_names,
    needs_nvcc,
)

DTYPES = TARGET_DTYPES["cuda"]

Point = dict[str, ParamValue]


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
            declared = set(kernel_names(source))
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


def _points(template: Template, dtype: str, every: bool) -> list[Point]:
    if every or dtype == "bf16":
        return list(template.valid_points())
    if template.best_known == template.defaults:
        return [template.defaults]
    return [template.defaults, template.best_known]


Results = dict[tuple[str, str], list[Compiled]]
"""(template name, dtype) -> each of its compiled points."""


def _compile(folder: Path, every: bool) -> Results:
    cases = {
        (template.name, dtype): [
            PointSource.render(template, point, dtype) for point in _points(template, dtype, every)
        ]
        for dtype in DTYPES
        for template in ROW_TEMPLATES
    }
    return compile_points(cases, folder)


def _keys(results: list[Compiled]) -> list[str]:
    return sorted(repr(sorted(r.point.params.items())) for r in results)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Results:
    return _compile(tmp_path_factory.mktemp("cuda_rows"), every=False)


@pytest.mark.slow  # nvcc over every bf16 point: about 80 s
@needs_nvcc
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("template", ROW_TEMPLATES, ids=_ids)
def test_points_compile_for_sm90_without_spills(
    template: Template, dtype: str, compiled: Results
) -> None:
    results = compiled[(template.name, dtype)]
    assert all(r.point.space == template.name and r.point.dtype == dtype for r in results)
    if dtype == "bf16":  # every valid point, once
        assert len(set(_keys(results))) == len(results) == len(list(template.valid_points()))
    else:  # the defaults and the best known point
        wanted = {repr(sorted(p.items())) for p in (template.defaults, template.best_known)}
        assert set(_keys(results)) == wanted and len(results) == len(wanted)
    assert all(template.is_valid(dict(r.point.params)) for r in results)
    assert_compiled(results)


@pytest.mark.slow  # nvcc over every bf16 point: about 80 s
@needs_nvcc
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("template", ROW_TEMPLATES, ids=_ids)
def test_best_known_points_do_not_spill(template: Template, dtype: str, compiled: Results) -> None:
    best = [r for r in compiled[(template.name, dtype)] if r.point.params == template.best_known]
    assert len(best) == 1, f"{template.name} {dtype}: the best known point was not compiled"
    assert best[0].functions, f"{template.name} {dtype}: no ptxas report for the best known point"
    assert_compiled(best)


@needs_nvcc
@pytest.mark.slow
def test_every_point_compiles_in_every_dtype(tmp_path: Path) -> None:
    results = _compile(tmp_path, every=True)
    for template in ROW_TEMPLATES:
        size = len(list(template.valid_points()))
        for dtype in DTYPES:
            assert len(set(_keys(results[(template.name, dtype)]))) == size, (template.name, dtype)
    assert_compiled(r for entries in results.values() for r in entries)
