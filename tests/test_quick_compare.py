"""The chunked all-pass comparison agrees with the whole-array rules on every case."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_workers.quick_compare import CHUNK, all_pass
from gpu_workers.verification import compare_whole
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
        if quick is not None:
            assert quick.rel == pytest.approx(worst.rel)
            assert (quick.flat_index,) == worst.index
            assert quick.used == pytest.approx(worst.used) and 0 <= quick.used <= 1
