"""The chunked all-pass comparison, and a call judged in blocks of rows, agree with the
whole-array rules on every case."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_workers.benchmarking import judge_calls, passes_on_bands
from gpu_workers.pass_band import pass_band
from gpu_workers.protocols import JudgedCall
from gpu_workers.quick_compare import CHUNK, all_pass, every_element_passes
from gpu_workers.sampled_rows import BLOCK_ELEMENTS, judged_in_row_blocks, passes_in_row_blocks
from gpu_workers.verification import compare_outputs, compare_whole
from kernels.builtin import BUILTIN

POISON = 0x7FBADBAD


def _cases(rng: np.random.Generator) -> list[tuple[str, np.ndarray, np.ndarray]]:
    n = 3 * CHUNK + 17  # chunks, and a ragged last one
    expected = rng.standard_normal(n)
    expected[5] = np.nan
    expected[CHUNK + 3] = np.inf
    expected[2 * CHUNK] = 1e300  # overflows float32: only +inf or a close value passes
    with np.errstate(over="ignore"):
        right = expected.astype(np.float32)
    cases = [("right", expected, right)]
    for name, index, value in [
        ("off_by_1e-3", 2 * CHUNK + 9, None),
        ("lost_nan", 5, 1.0),
        ("lost_inf", CHUNK + 3, 3.0),
        ("nan_for_finite", 3 * CHUNK + 1, np.nan),
        ("wrong_infinity", 2 * CHUNK, -np.inf),
    ]:
        got = right.copy()
        got[index] = got[index] * (1 + 1e-3) if value is None else value
        cases.append((name, expected, got))
    unwritten = right.copy()
    unwritten.view(np.uint32)[CHUNK + 100] = POISON
    cases.append(("unwritten", expected, unwritten))
    return cases


@pytest.mark.parametrize("seed", [0, 1])
def test_the_quick_pass_accepts_exactly_what_the_whole_array_rules_accept(seed: int) -> None:
    problem = BUILTIN["gelu"]  # one output, `y`
    tolerance = problem.tolerances["fp32"]
    for name, expected, got in _cases(np.random.default_rng(seed)):
        scale = np.abs(expected)
        quick = all_pass(got, expected, scale, POISON, tolerance)
        rejection, worst = compare_whole(
            problem, tolerance, {"y": got}, POISON, "compare", None, {"y": expected}, {"y": scale}
        )
        assert (quick is not None) == (rejection is None), (name, rejection)
        assert every_element_passes(got, expected, scale, POISON, tolerance) == (quick is not None)
        if quick is not None:
            assert quick.rel == pytest.approx(worst.rel)
            assert (quick.flat_index,) == worst.index
            assert quick.used == pytest.approx(worst.used) and 0 <= quick.used <= 1


def _row_cases(problem_name: str) -> list[tuple[str, dict[str, np.ndarray], np.ndarray]]:
    """(name, inputs, outputs) of one call: right, and wrong in ways the rules name, in
    the first block, a middle one and the ragged last one."""
    problem = BUILTIN[problem_name]
    cols = 1000
    step = BLOCK_ELEMENTS // cols
    rows = 3 * step + 5
    rng = np.random.default_rng(7)
    inputs = {
        a.name: rng.standard_normal([{"rows": rows, "cols": cols}[d] for d in a.dims]).astype(
            np.float32
        )
        for a in problem.inputs
    }
    right = problem.expected(inputs)["y"].astype(np.float32)
    cases = [("right", inputs, right)]
    for name, (row, col), change in [
        ("off_by_1e-3_first_block", (0, 3), lambda v: v * (1 + 1e-3)),
        ("just_within_middle_block", (step + 2, 9), lambda v: v * (1 + 5e-5)),
        ("nan_for_finite_last_block", (rows - 1, cols - 1), lambda v: np.nan),
        ("inf_for_finite", (2 * step, 0), lambda v: np.inf),
        ("unwritten", (3 * step + 1, 17), None),
    ]:
        got = right.copy()
        if change is None:
            got[row : row + 1, col : col + 1].view(np.uint32)[...] = POISON
        else:
            got[row, col] = change(got[row, col])
        cases.append((name, inputs, got))
    return cases


@pytest.mark.parametrize("problem_name", ["softmax", "rmsnorm"])
def test_a_call_judged_in_row_blocks_gets_the_whole_call_s_verdict(problem_name: str) -> None:
    problem = BUILTIN[problem_name]
    tolerance = problem.tolerances["fp32"]
    assert judged_in_row_blocks(problem)
    verdicts = []
    for name, inputs, got in _row_cases(problem_name):
        in_blocks = passes_in_row_blocks(problem, tolerance, inputs, {"y": got}, POISON)
        whole, _ = compare_outputs(problem, tolerance, inputs, {"y": got}, POISON)
        assert in_blocks == (whole is None), (name, whole)
        verdicts.append(in_blocks)
    assert verdicts == [True, False, True, False, False, False]


def test_a_failure_found_in_blocks_is_named_as_the_whole_call_names_it() -> None:
    problem = BUILTIN["softmax"]
    name, inputs, got = _row_cases("softmax")[4]  # infinity at row 2 * step, col 0
    call = JudgedCall(
        when="timed call 5",
        inputs=inputs,
        outputs={"y": got},
        inputs_after=inputs,
        poison_bits=POISON,
        seed=None,
    )
    rejection = judge_calls(problem, "fp32", [call])
    whole, _ = compare_outputs(
        problem,
        problem.tolerances["fp32"],
        inputs,
        {"y": got},
        POISON,
        stage="recheck",
        context={"when": "timed call 5"},
    )
    assert rejection is not None and whole is not None, name
    assert (rejection.reason, rejection.message) == (whole.reason, whole.message)
    assert f"y({2 * (BLOCK_ELEMENTS // 1000)}, 0) is inf" in rejection.message


@pytest.mark.parametrize("problem_name", ["layernorm", "matmul", "gelu", "kda"])
def test_problems_whose_scale_or_rows_a_block_would_change_are_judged_whole(
    problem_name: str,
) -> None:
    """A custom error scale may read across rows, and a one-dim output's default scale is
    its whole length's: a block could judge them otherwise."""
    assert not judged_in_row_blocks(BUILTIN[problem_name])


def test_an_infinite_scale_allows_no_more_than_the_rules_do() -> None:
    """Where the scale is not finite the rules judge by |expected|: the plain check, which
    would allow anything there, must leave that element to them."""
    problem = BUILTIN["gelu"]
    tolerance = problem.tolerances["fp32"]
    expected = np.linspace(1.0, 2.0, 2 * CHUNK)
    scale = np.abs(expected)
    scale[CHUNK + 7] = np.inf
    got = expected.astype(np.float32)
    assert every_element_passes(got, expected, scale, POISON, tolerance)
    got[CHUNK + 7] *= 1.01
    assert all_pass(got, expected, scale, POISON, tolerance) is None
    assert not every_element_passes(got, expected, scale, POISON, tolerance)


def test_a_call_passed_on_its_bands_is_one_the_judge_passes_with_its_inputs_unchanged() -> None:
    """`passes_on_bands` (the timing run's check of a re-check call in the arena) passes
    a call only where `judge_calls` does; a changed input fails it even when every output
    is in its band; without bands it decides nothing."""
    problem = BUILTIN["softmax"]
    tolerance = problem.tolerances["fp32"]
    rng = np.random.default_rng(3)
    inputs = {"x": rng.standard_normal((8, 64)).astype(np.float32)}
    expected = problem.expected(inputs)
    bands = {"y": pass_band(expected["y"], problem.scales(inputs, expected)["y"], tolerance)}
    right = expected["y"].astype(np.float32)
    wrong = right.copy()
    wrong[3, 5] *= 1.5
    changed = inputs["x"].copy()
    changed.view(np.uint32)[2, 7] ^= 1

    def call(outputs: np.ndarray, after: np.ndarray, with_bands: bool = True) -> JudgedCall:
        return JudgedCall(
            when="re-check",
            inputs=inputs,
            outputs={"y": outputs},
            inputs_after={"x": after},
            poison_bits=POISON,
            seed=1,
            bands=bands if with_bands else None,
        )

    assert passes_on_bands(problem, call(right, inputs["x"].copy()))
    assert judge_calls(problem, "fp32", [call(right, inputs["x"].copy())]) is None
    assert not passes_on_bands(problem, call(wrong, inputs["x"].copy()))
    assert judge_calls(problem, "fp32", [call(wrong, inputs["x"].copy())]) is not None
    assert not passes_on_bands(problem, call(right, changed))
    judged = judge_calls(problem, "fp32", [call(right, changed)])
    assert judged is not None and judged.reason == "input_modified"
    assert not passes_on_bands(problem, call(right, inputs["x"].copy(), with_bands=False))
