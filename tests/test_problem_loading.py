"""A problem file is checked when it is loaded: its mistakes name the file, never a kernel.
Derived dims and constraints between dims; imports beside the file; campaign ids."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import numpy as np
import pytest

from actors.campaign.campaign_file import CampaignSpec
from kernels import loading, shape_rules
from kernels.builtin import BUILTIN
from kernels.loading import ProblemLoadError, load_problem
from kernels.spec import ProblemError
from ops.cli import main
from tests.problem_files import ROTARY, ROTARY_MATH, write_rotary

GOOD_ROW_SUM = """
import numpy as np
from kernels.spec import Arg, Cost, Problem


def _row_sum(i):
    return {"y": i["x"].sum(axis=1)}


ROW_SUM = Problem(
    name="row_sum", description="y[r] = sum_c x[r, c]", dims=("rows", "cols"),
    args=(Arg("x", ("rows", "cols")), Arg("y", ("rows",), output=True)),
    reference=_row_sum, baseline=_row_sum,
    test_shapes=({"rows": 3, "cols": 5}, {"rows": 1, "cols": 1}),
    default_shape={"rows": 64, "cols": 64},
    cost=lambda s: Cost(bytes_moved=4 * s["rows"] * s["cols"], flops=s["rows"] * s["cols"]),
)
"""


def _row_sum_file(tmp_path: Path, reference: str, name: str = "row_sum.py") -> str:
    path = tmp_path / name
    path.write_text(GOOD_ROW_SUM.replace('return {"y": i["x"].sum(axis=1)}', reference))
    return f"{path}:ROW_SUM"


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        (
            'return {"y": i["x"].sum(axis=1, keepdims=True)}',
            r"the reference returns y of shape \(1, 1\); the signature says y\[rows\] = \(1,\)",
        ),
        (
            'return {"out": i["x"].sum(axis=1)}',
            r"the reference returns \['out'\]; the signature's outputs are \['y'\]",
        ),
        ('raise ValueError("no good")', "the reference raised ValueError: no good"),
        ('return i["x"].sum(axis=1)', "the reference returns a ndarray, not a dict"),
        (
            'return {"y": i["x"].sum(axis=1).astype(np.float32)}',
            "the reference returns y as float32; it works in float64",
        ),
    ],
)
def test_a_wrong_reference_is_refused_at_load_naming_the_file(
    tmp_path: Path, reference: str, message: str
) -> None:
    spec = _row_sum_file(tmp_path, reference)
    with pytest.raises(ProblemLoadError, match=message) as caught:
        load_problem(spec)
    text = str(caught.value)
    assert text.startswith(spec + ": ") and "\n" not in text
    assert "kernel" not in text


def test_a_good_file_loads_and_its_reference_is_run_quietly(tmp_path: Path) -> None:
    noisy = 'np.log(i["x"] - i["x"]); return {"y": i["x"].sum(axis=1)}'
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning would raise here
        problem = load_problem(_row_sum_file(tmp_path, noisy))
        expected = problem.expected(problem.generate({"rows": 2, "cols": 3}, "normal", 0))
    assert expected["y"].shape == (2,)


def test_a_wrong_baseline_or_scale_or_cost_is_refused_at_load(tmp_path: Path) -> None:
    text = GOOD_ROW_SUM
    cases = {
        "baseline=_row_sum,": ("baseline=lambda i: {'y': i['x']},", "the baseline returns y of"),
        "reference=_row_sum,": (
            "reference=_row_sum, error_scale=lambda i, e: {},",
            r"the error_scale returns \[\]",
        ),
        "cost=lambda s: Cost(": ("cost=lambda s: 1 or Cost(", "the cost model returns a int"),
    }
    for index, (old, (new, message)) in enumerate(cases.items()):
        path = tmp_path / f"case{index}.py"
        path.write_text(text.replace(old, new))
        with pytest.raises(ProblemLoadError, match=f"^{path}:ROW_SUM: {message}"):
            load_problem(f"{path}:ROW_SUM")


def test_a_reference_that_fails_later_is_the_problems_fault_not_the_kernels(
    tmp_path: Path,
) -> None:
    """A reference that works at the smallest shape but not at a larger one raises
    ProblemError (which `check` reports as bad input), never a kernel verdict."""
    spec = _row_sum_file(tmp_path, 'assert i["x"].size < 4; return {"y": i["x"].sum(axis=1)}')
    problem = load_problem(spec)
    with pytest.raises(ProblemError, match=r"row_sum\.py:ROW_SUM: the reference raised"):
        problem.expected(problem.generate({"rows": 3, "cols": 5}, "normal", 0))


def test_a_problem_file_imports_a_module_beside_it(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    problem = load_problem(write_rotary(one))
    assert problem.name == "rotary"
    # another folder's module of the same name is its own, not the first one's
    (two / "rotary_math.py").write_text(ROTARY_MATH.replace("a * c - b * s", "a * c + b * s"))
    (two / "rotary.py").write_text(ROTARY)
    other = load_problem(f"{two / 'rotary.py'}:ROTARY")
    inputs = problem.generate({"rows": 2, "cols": 4}, "normal", 0)
    assert not np.allclose(problem.expected(inputs)["y"], other.expected(inputs)["y"])
    assert str(one) not in __import__("sys").path
    missing = tmp_path / "lonely.py"
    missing.write_text("import no_such_helper\n")
    with pytest.raises(ProblemLoadError, match="ModuleNotFoundError: No module named"):
        load_problem(f"{missing}:X")


def test_derived_dims_are_in_every_shape_but_not_in_the_signature(tmp_path: Path) -> None:
    problem = load_problem(write_rotary(tmp_path))
    assert problem.c_signature() == (
        "void kernel(const float *x, const float *cosines, const float *sines, float *y, "
        "int64_t rows, int64_t cols)"
    )
    assert problem.full_shape({"rows": 3, "cols": 34}) == {"rows": 3, "cols": 34, "half": 17}
    inputs = problem.generate({"rows": 3, "cols": 34}, "normal", 1)
    assert inputs["cosines"].shape == (3, 17) and inputs["x"].shape == (3, 34)
    assert problem.nbytes({"rows": 3, "cols": 34}) == 4 * (2 * 3 * 34 + 2 * 3 * 17)
    assert problem.cost_for({"rows": 2, "cols": 8}).flops == 6 * 2 * 4


def test_drawn_shapes_are_moved_to_meet_the_constraints(tmp_path: Path) -> None:
    problem = load_problem(write_rotary(tmp_path))
    drawn_odd = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        raw = problem.draw_shapes(np.random.default_rng(seed)) if problem.draw_shapes else ()
        drawn_odd += sum(s["cols"] % 2 for s in raw)
        for shape in problem.trial_shapes(rng):
            assert shape["cols"] % 2 == 0 and shape["half"] == shape["cols"] // 2
            assert problem.shape_faults(shape) == []
    assert drawn_odd > 0, "the drawer gave odd widths that had to be moved"
    # the default drawer (spread_shapes) is held to them too
    plain = dataclasses.replace(problem, draw_shapes=None, constraints=("cols % 16 == 0",))
    drawn = plain.trial_shapes(np.random.default_rng(0))[len(plain.test_shapes) :]
    assert len(drawn) == len(plain.dims) + 2
    for shape in drawn:
        assert shape["cols"] % 16 == 0


def test_shapes_that_break_a_constraint_are_refused_in_one_line(tmp_path: Path) -> None:
    bad_test_shape = tmp_path / "bad_shape.py"
    bad_test_shape.write_text(ROTARY.replace('{"rows": 3, "cols": 34}', '{"rows": 3, "cols": 33}'))
    (tmp_path / "rotary_math.py").write_text(ROTARY_MATH)
    with pytest.raises(
        ProblemLoadError,
        match=r"bad_shape\.py:ROTARY: test shape \{'rows': 3, 'cols': 33\} breaks the "
        r"constraint cols % 2 == 0$",
    ):
        load_problem(f"{bad_test_shape}:ROTARY")
    gives_derived = tmp_path / "gives_derived.py"
    gives_derived.write_text(
        ROTARY.replace('{"rows": 64, "cols": 128}', '{"rows": 64, "cols": 128, "half": 64}')
    )
    with pytest.raises(ProblemLoadError, match=r"gives the derived dims \['half'\]"):
        load_problem(f"{gives_derived}:ROTARY")
    unknown = tmp_path / "unknown.py"
    unknown.write_text(ROTARY.replace('"cols // 2"', '"width // 2"'))
    with pytest.raises(ProblemLoadError, match=r"half = width // 2 reads unknown dims"):
        load_problem(f"{unknown}:ROTARY")
    raising = tmp_path / "raising.py"
    raising.write_text(ROTARY.replace("    return (\n", "    1 / 0\n    return (\n"))
    with pytest.raises(ProblemLoadError, match=r"draw_shapes raised ZeroDivisionError"):
        load_problem(f"{raising}:ROTARY")
    problem = load_problem(write_rotary(tmp_path))
    unmeetable = dataclasses.replace(problem, constraints=("cols > 100000",))
    with pytest.raises(ProblemError, match=r"rotary\.py:ROTARY: no drawn shape near"):
        unmeetable.trial_shapes(np.random.default_rng(0))


def test_shape_rules_take_plain_integer_expressions_only() -> None:
    assert shape_rules.full_shape(("n",), {"h": "max(n // 2, 1)"}, {"n": 1}) == {"n": 1, "h": 1}
    for text, message in [
        ("n / 2", "not an integer"),
        ("n - n", "a dim is at least 1"),
        ("__import__('os')", "only min, max and abs"),
        ("n.real", "Attribute is not allowed"),
        ("n +", "not an expression"),
    ]:
        with pytest.raises(shape_rules.ShapeRuleError, match=message):
            shape_rules.full_shape(("n",), {"h": text}, {"n": 4})
    assert shape_rules.broken(("n",), {}, ("n % 4 == 0",), {"n": 6}) == [
        "{'n': 6} breaks the constraint n % 4 == 0"
    ]
    assert shape_rules.fitted(("n",), {}, ("n % 4 == 0",), {"n": 6}) in ({"n": 4}, {"n": 8})
    assert shape_rules.fitted(("n",), {}, ("n > 100000",), {"n": 6}) is None


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_builtin_problem_passes_the_load_checks(name: str) -> None:
    problem = BUILTIN[name]
    loading._validate(problem, name)
    loading._check_shapes(problem, name)
    loading._check_functions(problem, name)


def test_the_campaign_id_comes_from_the_problems_name_not_the_files() -> None:
    a = CampaignSpec(problem="ops/my_ops.py:SWIGLU").campaign_id
    b = CampaignSpec(problem="ops/my_ops.py:GATE").campaign_id
    assert a.startswith("SWIGLU-cpu-") and b.startswith("GATE-cpu-")
    assert CampaignSpec(problem="softmax").campaign_id.startswith("softmax-cpu-")


def test_a_campaign_shape_that_breaks_a_constraint_is_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    problem = write_rotary(tmp_path)
    campaign = tmp_path / "rotary.toml"
    campaign.write_text(f'problem = "{problem}"\nshapes = [[64, 127]]\n')
    assert main(["run", str(campaign), "--home", str(tmp_path / "home")]) == 2
    assert capsys.readouterr().err == (
        "kfactory: error: shapes: {'rows': 64, 'cols': 127} breaks the constraint cols % 2 == 0\n"
    )
    assert not (tmp_path / "home").exists()
