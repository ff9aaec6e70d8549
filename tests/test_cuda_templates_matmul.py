"""The CUDA matmul templates and the cuda fusion space: every valid point, in every dtype
it takes, renders a source whose launch plan resolves at every test shape, and compiles
for sm_90; the hand-picked best points compile without spilling registers.

Compiling ~700 kernels one by one would take minutes, so the points compile in shared
translation units (tests/cuda_units.py); a unit that fails is split in halves until the
failing point is found, and the assertion names it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernels.builtin import BUILTIN
from kernels.cuda_launch import parse_launch_plan
from kernels.design_space import CUDA_TYPES, TARGET_DTYPES, InvalidParams, ParamValue, Template
from kernels.fusion import fusion_space
from kernels.templates import TEMPLATES, templates_for
from tests.cuda_units import (
    Compiled,
    PointSource,
    assert_compiled,
    compile_points,
    kernel_names,
    needs_nvcc,
)

DTYPES = TARGET_DTYPES["cuda"]
FUSED = BUILTIN["residual_rmsnorm_gelu"]
SPACES: dict[str, tuple[Template, str]] = {
    "matmul_cuda_tiled": (TEMPLATES["matmul_cuda_tiled"], "matmul"),
    "matmul_cuda_tensorcore": (TEMPLATES["matmul_cuda_tensorcore"], "matmul"),
    "fusion": (fusion_space(FUSED, "cuda"), "residual_rmsnorm_gelu"),
}


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
    count = 0
    for point in space.valid_points():
        rendered = space.render(point, dtype)
        where = f"{name} {dtype} {point}"
        assert rendered.flags == tuple(str(point["flags"]).split()), where
        assert not any(f.startswith(("-arch", "--gpu-architecture")) for f in rendered.flags)
        assert f"typedef {CUDA_TYPES[dtype]} kf_t;" in rendered.source, where
        plan = parse_launch_plan(rendered.source, problem)
        defined = set(kernel_names(rendered.source))
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

Builds = dict[tuple[str, str], list[Compiled]]
"""(space name, dtype) -> each of its valid points, compiled."""


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Builds:
    """Every valid point of every case, compiled in units on all cores."""
    cases = {
        (name, dtype): [
            PointSource.render(SPACES[name][0], point, dtype)
            for point in SPACES[name][0].valid_points()
        ]
        for name, dtype in CASES
    }
    return compile_points(cases, tmp_path_factory.mktemp("cuda_units"))


@pytest.mark.slow  # nvcc over every point: about 80 s
@needs_nvcc
@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_every_point_compiles_for_sm_90(name: str, dtype: str, builds: Builds) -> None:
    space, _ = SPACES[name]
    assert len(builds[(name, dtype)]) == sum(1 for _ in space.valid_points())
    assert_compiled(builds[(name, dtype)], spills=False)


@pytest.mark.slow  # nvcc over every point: about 80 s
@needs_nvcc
@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_the_best_points_do_not_spill(name: str, dtype: str, builds: Builds) -> None:
    space, _ = SPACES[name]
    best = [b for b in builds[(name, dtype)] if b.point.params == space.best_known]
    assert len(best) == 1 and best[0].functions, (name, dtype, "the best point was not compiled")
    assert_compiled(best)
