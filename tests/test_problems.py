"""Problem specs, the built-in library, loading from user files, and template design spaces."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kernels.builtin import BUILTIN
from kernels.design_space import InvalidParams
from kernels.loading import ProblemLoadError, load_problem
from kernels.spec import DISTRIBUTIONS, MASK_VALUE, fill, to_dtype
from kernels.templates import TEMPLATES, templates_for

LLC_BYTES = 32 << 20


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_problem_has_shapes_tiny_and_ragged(name: str) -> None:
    problem = BUILTIN[name]
    assert len(problem.test_shapes) >= 3
    sizes = [math.prod(s.values()) for s in problem.test_shapes]
    assert min(sizes) == 1, "a tiny shape"
    assert any(v % 16 for s in problem.test_shapes for v in s.values() if v > 1), "a ragged size"
    for shape in (*problem.test_shapes, problem.default_shape):
        assert set(shape) == set(problem.dims)
    assert set(problem.tolerances) >= set(problem.dtypes)


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm", "gelu", "matmul"])
def test_default_benchmark_shapes_exceed_the_llc(name: str) -> None:
    problem = BUILTIN[name]
    assert problem.nbytes(problem.default_shape) > LLC_BYTES
    assert BUILTIN["softmax"].default_shape == {"rows": 4096, "cols": 4096}


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_generators_are_fresh_deterministic_float32(distribution: str) -> None:
    problem = BUILTIN["softmax"]
    shape = {"rows": 5, "cols": 33}
    a = problem.generate(shape, distribution, seed=1)
    b = problem.generate(shape, distribution, seed=1)
    c = problem.generate(shape, distribution, seed=2)
    assert a["x"].dtype == np.float32 and a["x"].shape == (5, 33)
    assert np.array_equal(a["x"].view(np.uint32), b["x"].view(np.uint32))
    assert not np.array_equal(a["x"], c["x"], equal_nan=True)
    assert np.all(np.isfinite(a["x"])) == (distribution != "nonfinite")


def test_distributions_cover_large_tiny_and_ties() -> None:
    problem = BUILTIN["softmax"]
    shape = {"rows": 8, "cols": 64}
    assert np.abs(problem.generate(shape, "large", 0)["x"]).max() > 1e3
    tiny = np.abs(problem.generate(shape, "tiny", 0)["x"])
    assert 0 < tiny.max() < 1e-10
    ties = problem.generate(shape, "ties", 0)["x"]
    assert len(np.unique(ties)) <= 6
    assert np.all(ties[0] == ties[0, 0]), "a constant row"
    with pytest.raises(ValueError, match="unknown distribution"):
        problem.generate(shape, "cauchy", 0)


def test_references() -> None:
    x = BUILTIN["softmax"].generate({"rows": 3, "cols": 50}, "large", 0)
    y = BUILTIN["softmax"].expected(x)["y"]
    assert np.allclose(y.sum(axis=1), 1.0) and np.all(np.isfinite(y))
    g = BUILTIN["gelu"].expected({"x": np.array([0.0, 10.0, -10.0, 1.0], dtype=np.float32)})["y"]
    assert g[0] == 0 and abs(g[1] - 10) < 1e-9 and abs(g[2]) < 1e-9
    assert abs(g[3] - 0.8411919906) < 1e-9
    mm = BUILTIN["matmul"].generate({"M": 3, "N": 4, "K": 5}, "normal", 0)
    c = BUILTIN["matmul"].expected(mm)["C"]
    assert np.allclose(c, mm["A"].astype(np.float64) @ mm["B"].astype(np.float64))
    rms = BUILTIN["rmsnorm"].generate({"rows": 2, "cols": 9}, "normal", 0)
    out = BUILTIN["rmsnorm"].expected(rms)["y"]
    xr, w = rms["x"][0].astype(np.float64), rms["w"].astype(np.float64)
    assert np.allclose(out[0], xr / np.sqrt(np.mean(xr**2) + 1e-6) * w)


def _kda_by_hand(i: dict[str, np.ndarray]) -> np.ndarray:
    q, k, v, g, beta = (i[n].astype(np.float64) for n in ("q", "k", "v", "g", "beta"))
    b_, t_, h_, dk = q.shape
    dv = v.shape[-1]
    o = np.zeros((b_, t_, h_, dv))
    for b in range(b_):
        for h in range(h_):
            s = [[0.0] * dv for _ in range(dk)]
            for t in range(t_):
                for a in range(dk):
                    for e in range(dv):
                        s[a][e] *= math.exp(g[b, t, h, a])
                ks = [sum(k[b, t, h, a] * s[a][e] for a in range(dk)) for e in range(dv)]
                for a in range(dk):
                    for e in range(dv):
                        s[a][e] += beta[b, t, h] * k[b, t, h, a] * (v[b, t, h, e] - ks[e])
                for e in range(dv):
                    o[b, t, h, e] = sum(q[b, t, h, a] / math.sqrt(dk) * s[a][e] for a in range(dk))
    return o


def test_kda_reference_matches_the_recurrence_written_out() -> None:
    problem = BUILTIN["kda"]
    inputs = problem.generate({"B": 2, "T": 5, "H": 2, "K": 3, "V": 4}, "normal", 3)
    assert np.all(inputs["g"] < 0) and np.all((inputs["beta"] > 0) & (inputs["beta"] < 1))
    assert np.allclose(np.linalg.norm(inputs["k"].astype(np.float64), axis=-1), 1.0, atol=1e-6)
    assert np.allclose(problem.expected(inputs)["o"], _kda_by_hand(inputs), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_float32_baseline_agrees_with_the_reference(name: str) -> None:
    problem = BUILTIN[name]
    shape = problem.test_shapes[-1]
    inputs = problem.generate(shape, "normal", 7)
    expected = problem.expected(inputs)
    scales = problem.scales(inputs, expected)
    got = problem.baseline(inputs)
    tol = problem.tolerances["fp32"]
    for arg in problem.outputs:
        assert got[arg.name].dtype == np.float32
        err = np.abs(got[arg.name] - expected[arg.name])
        assert np.all(err <= tol.atol + tol.rtol * scales[arg.name])


def test_c_signatures_and_costs() -> None:
    assert BUILTIN["softmax"].c_signature() == (
        "void kernel(const float *x, float *y, int64_t rows, int64_t cols)"
    )
    assert "float *o, int64_t B, int64_t T, int64_t H, int64_t K, int64_t V" in (
        BUILTIN["kda"].c_signature()
    )
    assert BUILTIN["softmax"].cost({"rows": 4096, "cols": 4096}).bytes_moved == 128 << 20
    mm = BUILTIN["matmul"].cost({"M": 64, "N": 32, "K": 16})
    assert mm.flops == 2 * 64 * 32 * 16
    assert BUILTIN["residual_rmsnorm_gelu"].graph == ("add", "rmsnorm", "gelu")


def test_load_builtin_and_unknown() -> None:
    assert load_problem("softmax") is BUILTIN["softmax"]
    with pytest.raises(ProblemLoadError, match=r"built-in problems: .*softmax"):
        load_problem("sofmax")


USER_FILE = """
import numpy as np
from kernels.spec import Arg, Cost, Problem

def _swiglu(i):
    a, b = i["a"], i["b"]
    return {"y": a / (1 + np.exp(-a)) * b}

SWIGLU = Problem(
    name="swiglu", description="silu(a) * b", dims=("n",),
    args=(Arg("a", ("n",)), Arg("b", ("n",)), Arg("y", ("n",), output=True)),
    reference=_swiglu, baseline=_swiglu,
    test_shapes=({"n": 1}, {"n": 7}, {"n": 100}), default_shape={"n": 1 << 20},
    cost=lambda s: Cost(bytes_moved=12 * s["n"], flops=5 * s["n"]),
)
NOT_A_PROBLEM = 3
BROKEN = Problem(
    name="broken", description="", dims=("n",),
    args=(Arg("a", ("m",)), Arg("y", ("n",), output=True)),
    reference=_swiglu, baseline=_swiglu, test_shapes=({"n": 1},), default_shape={"n": 1},
    cost=lambda s: Cost(0, 0),
)
"""


def test_load_from_a_user_file(tmp_path: Path) -> None:
    path = tmp_path / "my_ops.py"
    path.write_text(USER_FILE)
    problem = load_problem(f"{path}:SWIGLU")
    assert problem.name == "swiglu"
    assert problem.load_spec.endswith("my_ops.py:SWIGLU")
    assert "const float *a, const float *b, float *y, int64_t n" in problem.c_signature()
    with pytest.raises(ProblemLoadError, match=r"has no attribute 'SWIGLOO'.*SWIGLU"):
        load_problem(f"{path}:SWIGLOO")
    with pytest.raises(ProblemLoadError, match=r"is a int, not a kernels\.Problem"):
        load_problem(f"{path}:NOT_A_PROBLEM")
    with pytest.raises(ProblemLoadError, match="unknown dims"):
        load_problem(f"{path}:BROKEN")
    with pytest.raises(ProblemLoadError, match="does not exist"):
        load_problem(f"{tmp_path}/nope.py:X")
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy\nraise RuntimeError('boom')\n")
    with pytest.raises(ProblemLoadError, match=r"importing .* failed: RuntimeError: boom"):
        load_problem(f"{bad}:X")
    with pytest.raises(ProblemLoadError, match=r"path\.py:NAME"):
        load_problem(f"{path}:")


def test_every_problem_has_a_cpu_template_and_two_for_matmul() -> None:
    for name in BUILTIN:
        assert templates_for(name, "cpu"), name
    assert len(templates_for("matmul", "cpu")) >= 2
    assert len({t.algorithm for t in templates_for("matmul", "cpu")}) == 2
    # softmax's pass structures (two passes or online, buffered, tiled) are parameters
    # of one template
    [softmax] = templates_for("softmax", "cpu")
    assert {p.name for p in softmax.params} >= {"fuse", "buffer", "tile", "prefetch", "isa"}


@pytest.mark.parametrize("name", sorted(n for n, t in TEMPLATES.items() if t.target == "cpu"))
def test_design_spaces_are_plain_data_with_constraints(name: str) -> None:
    template = TEMPLATES[name]
    space = template.space()
    assert all(isinstance(v, int | str | bool) for choices in space.values() for v in choices)
    assert {"threads", "simdlen", "flags"} <= set(space)
    assert template.is_valid(template.defaults) and template.is_valid(template.best_known)
    points = list(template.valid_points())
    total = math.prod(len(c) for c in space.values())
    assert 0 < len(points) < total, "constraints remove some points"
    rendered = template.render(points[0])
    assert "void kernel(" in rendered.source
    assert rendered.flags[0].startswith("-O")
    with pytest.raises(InvalidParams, match="unknown parameter"):
        template.render({**template.defaults, "bogus": 1})
    with pytest.raises(InvalidParams, match="not in"):
        template.render({**template.defaults, "threads": 3})


def test_a_violated_constraint_is_named() -> None:
    packed = TEMPLATES["matmul_packed"]
    params = {**packed.defaults, "mr": 12, "nr": 48, "simdlen": 8}
    assert packed.violations(params) == ["accumulators fit in registers"]
    assert packed.render(packed.defaults).source != packed.render(packed.best_known).source


def test_the_new_distributions_reach_nan_inf_the_type_limits_masks_and_many_decades() -> None:
    shape = (64, 256)
    rng = np.random.default_rng(3)
    special = fill(shape, "nonfinite", rng)
    assert np.isnan(special).any() and np.isposinf(special).any() and np.isneginf(special).any()
    assert np.isfinite(special).mean() > 0.9, "most rows stay finite"
    nan_bits = special[np.isnan(special)].view(np.uint32)
    assert set(nan_bits.tolist()) <= {0x7FC00000, 0xFFC00000}, "a plain NaN, never a poison"
    extreme = np.abs(fill(shape, "extreme", rng).astype(np.float64))
    assert extreme.max() > 3e37 and extreme.max() <= np.finfo(np.float32).max
    assert (extreme < np.finfo(np.float32).smallest_normal).any(), "denormals"
    assert extreme.min() >= np.finfo(np.float32).smallest_normal / 16
    assert (extreme > 1e30).mean() > 0.3
    mixed = fill(shape, "mixed", rng)
    assert (mixed == np.float32(MASK_VALUE)).any()
    assert np.all(mixed == np.float32(MASK_VALUE), axis=1).any(), "a row masked throughout"
    assert ((np.abs(mixed) > 1e5) & (mixed != np.float32(MASK_VALUE))).any(), "outliers"
    spread = np.abs(fill(shape, "spread", rng).astype(np.float64))
    assert spread.min() < 1e-15 and spread.max() > 1e15
    for dtype in ("bf16", "fp16"):  # in range of the dtype, the limits of the dtype
        values = BUILTIN["softmax"].generate({"rows": 8, "cols": 512}, "extreme", 1, dtype)["x"]
        as64 = np.abs(values.astype(np.float64))
        assert np.isfinite(as64).all() and (as64 > 0).all()
    assert (
        np.abs(BUILTIN["rmsnorm"].generate({"rows": 8, "cols": 64}, "extreme", 1)["x"]).max() < 3e16
    )


def test_to_dtype_clips_finite_overflow_but_keeps_intended_infinities() -> None:
    values = np.array([1e300, -1e300, np.inf, -np.inf, np.nan, 1.5])
    got = to_dtype(values, "fp16").astype(np.float64)
    assert got[:2].tolist() == [65504.0, -65504.0]
    assert got[2] == np.inf and got[3] == -np.inf and np.isnan(got[4]) and got[5] == 1.5


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_drawn_shapes_are_tall_wide_ragged_and_page_sized(name: str) -> None:
    problem = BUILTIN[name]
    rng = np.random.default_rng(8)
    shapes = problem.trial_shapes(rng)
    assert shapes[: len(problem.test_shapes)] == tuple(dict(s) for s in problem.test_shapes)
    assert any(all(v == 1 for v in s.values()) for s in shapes), "1x1"
    drawn = shapes[len(problem.test_shapes) :]
    assert any(max(s.values()) > 1024 and max(s.values()) % 16 for s in drawn), "large, ragged"
    assert any(v % 1024 == 0 for s in drawn for v in s.values()), "whole 4 KiB pages"
    if problem.dims == ("rows", "cols"):
        assert any(s["rows"] > 1024 for s in drawn), "tall"
        assert any(s["cols"] > 1024 and s["cols"] % 16 for s in drawn), "wide"
    assert problem.trial_shapes(np.random.default_rng(9)) != shapes, "drawn per check"
    assert max(problem.nbytes(s) for s in shapes) < 8 << 20, "a cheap float64 reference"


def test_problems_declare_their_distributions_and_non_finite_semantics() -> None:
    assert BUILTIN["softmax"].distributions == DISTRIBUTIONS
    assert "extreme" not in BUILTIN["kda"].distributions
    with pytest.raises(ValueError, match="not verified over"):
        BUILTIN["kda"].generate({"B": 1, "T": 2, "H": 1, "K": 2, "V": 2}, "extreme", 0)
    gelu = BUILTIN["gelu"].generate({"n": 4096}, "nonfinite", 0)["x"]
    assert np.isnan(gelu).any() and np.isposinf(gelu).any() and not np.isneginf(gelu).any()
    assert all(p.nonfinite == "propagate" for p in BUILTIN.values())
    # the float64 reference's own NaN / Inf are the expected outputs
    x = np.array([[1.0, np.nan, 2.0], [1.0, np.inf, 2.0], [1.0, -np.inf, 2.0]], np.float32)
    y = BUILTIN["softmax"].expected({"x": x})["y"]
    assert np.isnan(y[0]).all() and np.isnan(y[1]).all()
    assert y[2, 1] == 0 and np.isfinite(y[2]).all()
