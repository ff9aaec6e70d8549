"""What a problem is: a float64 reference, inputs, a C signature, tolerances and a cost model.

A problem never knows how a kernel is built or run; device back ends read it.
Calling convention for every target: one pointer per argument, in `args` order
(inputs `const`), then one `int64_t` per dimension, in `dims` order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
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

DTYPES: dict[str, type[Any]] = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
"""Element types, by the name campaigns use. Kernels take and return arrays of one dtype."""


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


def tolerances(fp32: Tolerance) -> dict[str, Tolerance]:
    """Tolerances for every dtype from the fp32 one. A half-precision output carries a
    rounding error of up to half an ulp (2^-8 relative for bf16, 2^-11 for fp16): the
    tolerance allows four of them (so a result one ulp off passes), and for fp16 one
    subnormal step absolute."""
    return {
        "fp32": fp32,
        "bf16": Tolerance(rtol=max(fp32.rtol, 1.6e-2), atol=max(fp32.atol, 1e-30)),
        "fp16": Tolerance(rtol=max(fp32.rtol, 2e-3), atol=max(fp32.atol, 6e-8)),
    }


def default_tolerances() -> dict[str, Tolerance]:
    return tolerances(Tolerance(rtol=1e-4, atol=1e-30))


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
    spec: str = ""
    """How to load it again in another process: a built-in name or `path.py:NAME`."""

    @property
    def load_spec(self) -> str:
        return self.spec or self.name

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes the problem can be verified in: those it has a tolerance for."""
        return tuple(d for d in DTYPES if d in self.tolerances)

    @property
    def inputs(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if not a.output)

    @property
    def outputs(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.output)

    def c_signature(self, dtype: str = "fp32", name: str = "kernel") -> str:
        if dtype != "fp32":
            raise ValueError(f"C kernels take fp32 arrays, not {dtype}")
        ctype = "float"
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
        return {a.name: to_dtype(raw[a.name], dtype) for a in self.inputs}

    def expected(self, inputs: Arrays) -> Arrays:
        as64 = {k: v.astype(np.float64) for k, v in inputs.items()}
        return self.reference(as64)

    def scales(self, inputs: Arrays, expected: Arrays) -> Arrays:
        if self.error_scale is None:
            return {k: np.abs(v) for k, v in expected.items()}
        as64 = {k: v.astype(np.float64) for k, v in inputs.items()}
        return self.error_scale(as64, expected)

    def cost_for(self, shape: Shape, dtype: str = "fp32") -> Cost:
        """`cost` counts fp32 bytes; the traffic of another dtype scales with its size."""
        cost = self.cost(shape)
        itemsize = np.dtype(DTYPES[dtype]).itemsize
        return Cost(bytes_moved=cost.bytes_moved * itemsize // 4, flops=cost.flops)

    def nbytes(self, shape: Shape, dtype: str = "fp32") -> int:
        itemsize = np.dtype(DTYPES[dtype]).itemsize
        return sum(int(np.prod(a.shape(shape))) * itemsize for a in self.args)


def to_dtype(values: Array, dtype: str) -> Array:
    """float64 values in a dtype: out-of-range values clipped to its largest finite value
    (an input is a finite number in the kernel's type, never an overflowed infinity)."""
    np_dtype = DTYPES[dtype]
    largest = float(ml_dtypes.finfo(np_dtype).max)
    return np.ascontiguousarray(np.clip(values, -largest, largest).astype(np_dtype))


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
