"""Half-precision problems: inputs, tolerances, and the verifier's rules at 16 bits."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpu_workers.protocols import RunOutput, Trial
from gpu_workers.verification import bits, check_outputs, judge_runs
from kernels.builtin import BUILTIN
from kernels.spec import DTYPES, to_dtype

HALF = ("bf16", "fp16")
POISON = {"bf16": 0x7FAD, "fp16": 0x7DAD}


def _softmax_trial(dtype: str, distribution: str = "normal") -> Trial:
    shape = {"rows": 3, "cols": 7}
    inputs = BUILTIN["softmax"].generate(shape, distribution, seed=3, dtype=dtype)
    return Trial(0, shape, distribution, 3, inputs, runs=1)


def _correct(problem: str, inputs: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """The float64 reference rounded once into the dtype: what an exact kernel returns."""
    expected = BUILTIN[problem].expected(inputs)
    with np.errstate(over="ignore"):
        return {k: v.astype(DTYPES[dtype]) for k, v in expected.items()}


@pytest.mark.parametrize("problem", sorted(BUILTIN))
def test_every_builtin_problem_takes_bf16_and_fp16(problem: str) -> None:
    assert set(BUILTIN[problem].dtypes) == {"fp32", "bf16", "fp16"}


@pytest.mark.parametrize("dtype", HALF)
def test_inputs_come_in_the_dtype_and_stay_finite(dtype: str) -> None:
    inputs = BUILTIN["softmax"].generate({"rows": 64, "cols": 4096}, "large", 1, dtype)
    x = inputs["x"]
    assert x.dtype == np.dtype(DTYPES[dtype])
    assert np.isfinite(x.astype(np.float64)).all()
    largest = float(ml_dtypes.finfo(DTYPES[dtype]).max)
    clipped = to_dtype(np.array([1e300, -1e300, 1.5]), dtype).astype(np.float64)
    assert clipped.tolist() == [largest, -largest, 1.5]  # never an overflowed infinity


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("problem", sorted(BUILTIN))
def test_a_correctly_rounded_answer_passes_in_every_distribution(dtype: str, problem: str) -> None:
    spec = BUILTIN[problem]
    for distribution in ("normal", "large", "tiny", "ties"):
        inputs = spec.generate(spec.test_shapes[-1], distribution, 7, dtype)
        got = _correct(problem, inputs, dtype)
        rejection, worst = check_outputs(spec, spec.tolerances[dtype], inputs, got, POISON[dtype])
        assert rejection is None, (distribution, rejection)
        assert worst <= 2.0**-8  # half an ulp of bf16 at most, relative to the scale


def _ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """One ulp of `dtype` at each normal value: the gap to the next larger number of the
    type, eps times the power of two at or below the value."""
    _, exponent = np.frexp(np.abs(values.astype(np.float64)))  # value = m * 2**exponent
    return np.ldexp(float(ml_dtypes.finfo(DTYPES[dtype]).eps), exponent - 1)


def _moved(values: np.ndarray, dtype: str, ulps: int) -> np.ndarray:
    """`values` (of `dtype`) moved by `ulps` ulps each, exactly."""
    exact = values.astype(np.float64) + ulps * _ulp(values, dtype)
    moved = exact.astype(DTYPES[dtype])
    assert (moved.astype(np.float64) == exact).all(), "the move is not representable"
    return moved


@pytest.mark.parametrize("dtype", HALF)
def test_an_answer_one_ulp_off_passes_and_eight_ulps_off_is_refused(dtype: str) -> None:
    """The tolerance of a 16-bit output allows a rounding error of a few ulps of its type,
    so the boundary lies between one ulp off (always passes) and eight (always refused)."""
    trial = _softmax_trial(dtype)
    spec = BUILTIN["softmax"]
    tolerance = spec.tolerances[dtype]
    y = _correct("softmax", trial.inputs, dtype)["y"]
    assert (y.astype(np.float64) >= float(ml_dtypes.finfo(DTYPES[dtype]).tiny)).all()  # normal
    for ulps in (1, -1):  # every element one ulp off, up or down
        off = {"y": _moved(y, dtype, ulps)}
        rejection, worst = check_outputs(spec, tolerance, trial.inputs, off, POISON[dtype])
        assert rejection is None, (ulps, rejection)
        assert worst > 0.0
    for ulps in (8, -8):  # one element eight ulps off
        off = {"y": y.copy()}
        off["y"][1, 2] = _moved(y[1, 2:3], dtype, ulps)[0]
        rejection, _ = check_outputs(spec, tolerance, trial.inputs, off, POISON[dtype])
        assert rejection is not None and rejection.reason == "wrong_value", (ulps, rejection)
        assert rejection.evidence["first_index"] == "(1, 2)"
        assert rejection.evidence["wrong_count"] == "1"


@pytest.mark.parametrize("dtype", HALF)
def test_poisoned_16_bit_elements_are_unwritten_not_nan(dtype: str) -> None:
    trial = _softmax_trial(dtype)
    got = _correct("softmax", trial.inputs, dtype)
    poisoned = got["y"].copy()
    bits(poisoned.reshape(-1))[4] = POISON[dtype]
    with np.errstate(invalid="ignore"):
        assert np.isnan(poisoned.astype(np.float64).reshape(-1)[4])
    spec = BUILTIN["softmax"]
    rejection, _ = check_outputs(
        spec, spec.tolerances[dtype], trial.inputs, {"y": poisoned}, POISON[dtype]
    )
    assert rejection is not None and rejection.reason == "unwritten"
    assert rejection.evidence["first_index"] == "(0, 4)"


def test_infinity_passes_only_where_the_exact_result_overflows_fp16() -> None:
    spec = BUILTIN["matmul"]
    a = np.array([[200.0, 200.0], [1.0, 2.0]], dtype=np.float16)
    b = np.array([[200.0, 1.0], [200.0, 1.0]], dtype=np.float16)
    inputs = {"A": a, "B": b}
    got = _correct("matmul", inputs, "fp16")
    assert np.isinf(got["C"][0, 0])  # 80000 > 65504: the correctly rounded answer is inf
    rejection, _ = check_outputs(spec, spec.tolerances["fp16"], inputs, got, POISON["fp16"])
    assert rejection is None, rejection
    wrong = got["C"].copy()
    wrong[1, 1] = np.inf  # 3 is representable: infinity there is a bug
    rejection, _ = check_outputs(
        spec, spec.tolerances["fp16"], inputs, {"C": wrong}, POISON["fp16"]
    )
    assert rejection is not None and rejection.reason == "non_finite"
    assert rejection.evidence["first_index"] == "(1, 1)"


@pytest.mark.parametrize("dtype", HALF)
def test_runs_compared_bit_for_bit_and_inputs_checked_at_16_bits(dtype: str) -> None:
    trial = Trial(**{**_softmax_trial(dtype).__dict__, "runs": 2})
    spec = BUILTIN["softmax"]
    good = _correct("softmax", trial.inputs, dtype)
    other = {"y": good["y"].copy()}
    bits(other["y"].reshape(-1))[5] ^= 1  # one ulp apart: within tolerance, but not identical
    runs = [
        RunOutput(0, 0, POISON[dtype], good, dict(trial.inputs)),
        RunOutput(0, 1, POISON[dtype], other, dict(trial.inputs)),
    ]
    rejection = judge_runs(spec, spec.tolerances[dtype], [trial], runs).rejection
    assert rejection is not None and rejection.reason == "nondeterministic"
    changed = trial.inputs["x"].copy()
    bits(changed.reshape(-1))[0] ^= 1
    runs = [RunOutput(0, r, POISON[dtype], good, {"x": changed}) for r in (0, 1)]
    rejection = judge_runs(spec, spec.tolerances[dtype], [trial], runs).rejection
    assert rejection is not None and rejection.reason == "input_modified"


def test_cost_counts_the_bytes_of_the_dtype() -> None:
    spec = BUILTIN["softmax"]
    shape = {"rows": 8192, "cols": 8192}
    assert spec.cost_for(shape, "bf16").bytes_moved * 2 == spec.cost_for(shape, "fp32").bytes_moved
    assert spec.cost_for(shape, "fp16").flops == spec.cost(shape).flops
