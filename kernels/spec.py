"""What a problem is: a float64 reference, inputs, a C signature, tolerances and a cost model.

A problem never knows how a kernel is built or run; device back ends read it.
Calling convention for every target: one pointer per argument, in `args` order
(inputs `const`), then one `int64_t` per dimension, in `dims` order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]
Shape = Mapping[str, int]
Arrays = dict[str, Array]

DISTRIBUTIONS: tuple[str, ...] = ("normal", "uniform", "large", "tiny", "ties")
"""Value distributions every problem is verified over.

normal: N(0, 1). uniform: U(-1, 1). large: N(0, 1) * 1e4 (overflows a naive exp).
tiny: N(0, 1) * 1e-15 (squares and cubes approach the denormal range).
ties: a few exact values repeated, including constant rows.
"""

DTYPES: dict[str, type[np.floating]] = {"fp32": np.float32}


@dataclass(frozen=True)
class Arg:
    """One array argument of the kernel: its name, its shape as dimension names, direction."""

    name: str
    dims: tuple[str, ...]
    output: bool = False

    def shape(self, shape: Shape) -> tuple[int, ...]:
        return tuple(int(shape[d]) for d in self.dims)


@dataclass(frozen=True)
class Tolerance:
    """An element passes when |got - expected| <= atol + rtol * scale (scale from the problem)."""

    rtol: float
    atol: float


@dataclass(frozen=True)
class Cost:
    """The least work any correct kernel must do: bytes moved to and from memory, and flops."""

    bytes_moved: int
    flops: int


def default_tolerances() -> dict[str, Tolerance]:
    return {"fp32": Tolerance(rtol=1e-4, atol=1e-30)}


@dataclass(frozen=True)
class Problem:
    """A target operation. `reference` works in float64 and returns every output by name."""

    name: str
    description: str
    dims: tuple[str, ...]
    args: tuple[Arg, ...]
    reference: Callable[[Arrays], Arrays]
    baseline: Callable[[Arrays], Arrays]
    """The float32 numpy implementation a user would write; the benchmark's baseline."""
    test_shapes: tuple[dict[str, int], ...]
    default_shape: dict[str, int]
    cost: Callable[[Shape], Cost]
    tolerances: dict[str, Tolerance] = field(default_factory=default_tolerances)
    make_inputs: Callable[[Shape, str, np.random.Generator], Arrays] | None = None
    """Custom input generator; by default every input is filled from the distribution."""
    error_scale: Callable[[Arrays, Arrays], Arrays] | None = None
    """Per-element magnitude the error is judged against; by default |expected|."""
    graph: tuple[str, ...] = ()
    """For graph problems: the chain of elementary ops a fuser may fuse."""
    dtypes: tuple[str, ...] = ("fp32",)
    spec: str = ""
    """How to load it again in another process: a built-in name or `path.py:NAME`."""

    @property
    def load_spec(self) -> str:
        return self.spec or self.name

    @property
    def inputs(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if not a.output)

    @property
    def outputs(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.output)

    def c_signature(self, dtype: str = "fp32", name: str = "kernel") -> str:
        ctype = {"fp32": "float"}[dtype]
        params = [
            f"{ctype} *{a.name}" if a.output else f"const {ctype} *{a.name}" for a in self.args
        ]
        params += [f"int64_t {d}" for d in self.dims]
        return f"void {name}({', '.join(params)})"

    def generate(self, shape: Shape, distribution: str, seed: int, dtype: str = "fp32") -> Arrays:
        """Fresh inputs for one trial, already in the kernel's dtype."""
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {distribution!r}; known: {DISTRIBUTIONS}")
        rng = np.random.default_rng(seed)
        if self.make_inputs is not None:
            raw = self.make_inputs(shape, distribution, rng)
        else:
            raw = {a.name: fill(a.shape(shape), distribution, rng) for a in self.inputs}
        np_dtype = DTYPES[dtype]
        return {a.name: np.ascontiguousarray(raw[a.name], dtype=np_dtype) for a in self.inputs}

    def expected(self, inputs: Arrays) -> Arrays:
        as64 = {k: v.astype(np.float64) for k, v in inputs.items()}
        return self.reference(as64)

    def scales(self, inputs: Arrays, expected: Arrays) -> Arrays:
        if self.error_scale is None:
            return {k: np.abs(v) for k, v in expected.items()}
        as64 = {k: v.astype(np.float64) for k, v in inputs.items()}
        return self.error_scale(as64, expected)

    def nbytes(self, shape: Shape, dtype: str = "fp32") -> int:
        itemsize = np.dtype(DTYPES[dtype]).itemsize
        return sum(int(np.prod(a.shape(shape))) * itemsize for a in self.args)


def fill(shape: tuple[int, ...], distribution: str, rng: np.random.Generator) -> Array:
    """Values of one array drawn from a named distribution (float64)."""
    if distribution == "normal":
        return rng.standard_normal(shape)
    if distribution == "uniform":
        return rng.uniform(-1.0, 1.0, shape)
    if distribution == "large":
        return rng.standard_normal(shape) * 1e4
    if distribution == "tiny":
        return rng.standard_normal(shape) * 1e-15
    if distribution == "ties":
        values = rng.choice(np.array([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0]), size=shape)
        if len(shape) >= 2 and shape[0] > 0:
            values[0, ...] = 1.0  # a constant row: every element ties
        return values
    raise ValueError(f"unknown distribution {distribution!r}")
