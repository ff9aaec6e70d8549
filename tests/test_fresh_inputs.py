"""The generator of fresh timing inputs: N(0, 1) values, new for every key pair."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpu_workers.cpu.trusted_build import fresh_inputs_library
from tests.cpu_support import kf_cache

__all__ = ["kf_cache"]
Fill = Callable[[int, int, int, int], None]


@pytest.fixture(scope="module")
def fill(kf_cache: Path) -> Fill:
    function = ctypes.CDLL(str(fresh_inputs_library(kf_cache / "cpu-kernels"))).kf_fill_normal
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint32, ctypes.c_uint32]
    function.restype = None
    fill: Fill = function
    return fill


def _filled(fill: Fill, n: int, key_a: int, key_b: int) -> np.ndarray:
    out = np.full(n, np.nan, np.float32)
    fill(out.ctypes.data, n, key_a, key_b)
    return out


@pytest.mark.parametrize("n", [1, 2, 7, (1 << 21) + 1])
def test_every_element_is_written_and_finite(fill: Fill, n: int) -> None:
    assert np.isfinite(_filled(fill, n, 1, 2)).all()


def test_both_halves_are_standard_normal_and_independent(fill: Fill) -> None:
    """The first half holds each pair's cosine, the second its sine: each half alone, and
    the two against each other, look like independent N(0, 1) draws."""
    n = 1 << 22
    values = _filled(fill, n, 12345, 67890).astype(np.float64)
    first, second = values[: n // 2], values[n // 2 :]
    for half in (first, second):
        assert abs(half.mean()) < 0.005 and abs(half.std() - 1.0) < 0.005
        assert abs(np.mean(half**4) - 3.0) < 0.05  # a normal's kurtosis
        assert abs(np.mean(np.abs(half) < 1.0) - 0.6827) < 0.002
    assert abs(np.corrcoef(first, second)[0, 1]) < 0.005
    assert abs(np.corrcoef(first**2, second**2)[0, 1]) < 0.005


def test_new_keys_give_new_values(fill: Fill) -> None:
    one, again, other = (_filled(fill, 4096, *keys) for keys in ((1, 2), (1, 2), (1, 3)))
    assert np.array_equal(one, again)
    assert not np.any(one[len(one) // 2 :] == other[len(other) // 2 :])
    assert abs(np.corrcoef(one, other)[0, 1]) < 0.1
