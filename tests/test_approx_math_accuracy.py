"""The template maths the `approx_math` operator puts into kernels stays within the error
bounds it claims (`helpers.ERROR_BOUND`), which the operator compares with a problem's
rtol: each helper is compiled as the operator inserts it and run over its function's
range against numpy in float64."""

from __future__ import annotations

import ctypes
import math
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from actors.search.operators.helpers import (
    ERROR_BOUND,
    LEVELS,
    _with_callees,
    error_bound,
    math_name,
    render,
)

_NEG = -np.geomspace(0.999999, 1e-12, 50_000)
RANGES: dict[str, tuple[Callable[[np.ndarray], np.ndarray], np.ndarray]] = {
    "exp": (np.exp, np.linspace(-87.0, 88.0, 100_001)),
    "log": (np.log, np.geomspace(1e-44, 3e38, 100_001)),
    "log1p": (np.log1p, np.concatenate([_NEG, np.geomspace(1e-12, 3e38, 50_000)])),
    "tanh": (np.tanh, np.linspace(-10.0, 10.0, 100_001)),
    "erf": (np.vectorize(math.erf), np.linspace(-6.0, 6.0, 20_001)),
    "rsqrt": (lambda x: 1.0 / np.sqrt(x), np.geomspace(1e-44, 3e38, 100_001)),
    "sqrt": (np.sqrt, np.geomspace(1e-44, 3e38, 100_001)),
}


def _compiled(name: str, folder: Path) -> Callable[[np.ndarray], np.ndarray]:
    source = folder / f"{name}.c"
    helpers = "".join(render(n) for n in _with_callees([name]))
    source.write_text(
        "#include <stdint.h>\n" + helpers + "void run(const float *x, float *y, long n) {\n"
        f"    for (long i = 0; i < n; ++i) y[i] = {name}(x[i]);\n}}\n"
    )
    library = folder / f"{name}.so"
    subprocess.run(
        ["cc", "-O2", "-fno-trapping-math", "-shared", "-fPIC", "-o", library, source],
        check=True,
    )
    run = ctypes.CDLL(str(library)).run

    def call(x: np.ndarray) -> np.ndarray:
        y = np.empty_like(x)
        run(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), len(x))
        return y

    return call


def test_every_function_has_a_bound_and_a_range() -> None:
    assert set(ERROR_BOUND) == set(RANGES)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", sorted(RANGES))
def test_each_helper_is_within_its_claimed_error(kind: str, level: str, tmp_path: Path) -> None:
    reference, points = RANGES[kind]
    x = points.astype(np.float32)
    got = _compiled(math_name(kind, level), tmp_path)(x).astype(np.float64)
    expected = reference(x.astype(np.float64))
    error = np.abs(got - expected) / np.maximum(np.abs(expected), np.finfo(np.float32).tiny)
    assert float(error.max()) <= error_bound(kind, level), (kind, level, float(error.max()))
