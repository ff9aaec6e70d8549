"""What a problem is: a float64 reference, inputs, a C signature, tolerances and a cost model.

A problem never knows how a kernel is built or run; device back ends read it.
Calling convention for every target: one pointer per argument, in `args` order
(inputs `const`), then one `int64_t` per dimension, in `dims` order. Derived dims
(`derived`, e.g. `half = cols // 2`) are not passed: the kernel computes them from its
dims. A kernel that should be passed such a value declares it an ordinary dim and ties
it with a constraint (`cols == 2 * half`).

A problem has a float64 reference and the float32 numpy baseline; input generators over
`DISTRIBUTIONS` (a problem says which it supports, and with `nonfinite` what its
reference does with NaN and infinities); fixed edge shapes (`test_shapes`) and shapes
drawn per check (`draw_shapes`, moved to meet the constraints); the shape it is timed
at by default (`default_shape`); tolerances per dtype; and a cost model (bytes moved,
flops). Its dtypes are those it has a tolerance for (`tolerances`: a half-precision one
allows four half-ulps of rounding). Finite inputs are clipped to the dtype's finite range
(`to_dtype`); an output may be infinite only where the exact result rounds to infinity
(`gpu_workers.verification`). A reference that fails raises ProblemError: the problem's
fault, never a kernel verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from kernels import shape_rules

Array = npt.NDArray[Any]
Shape = Mapping[str, int]
Arrays = dict[str, Array]

DISTRIBUTIONS: tuple[str, ...] = (
    "normal",
    "uniform",
    "large",
    "tiny",
    "ties",
    "nonfinite",
    "extreme",
    "mixed",
    "spread",
)
"""Value distributions every problem is verified over (those it supports: `Problem.distributions`).

normal: N(0, 1). uniform: U(-1, 1). large: N(0, 1) * 1e4 (overflows a naive exp).
tiny: N(0, 1) * 1e-15 (squares and cubes approach the denormal range).
ties: a few exact values repeated, including constant rows.
nonfinite: N(0, 1) with NaN, +Inf and -Inf sprinkled over a few rows (the problem's
  `nonfinite_inputs`); never a row (last axis) of -Inf only.
extreme: half the values near the top of the range (|x| in [top/128, 2 top), top the smaller
  of the problem's `input_limit` and half the dtype's largest finite value), half near
  the bottom (from 1/16 of the smallest normal, denormals, to 16x it); random signs.
mixed: N(0, 1) rows with a few outliers of magnitude ~1e6 and attention-style mask values
  (-1e9): whole rows masked, masked suffixes, scattered masks.
spread: sign * 2**U(lo, hi) (random mantissa), values across many decades: from 1e-20
  (or the dtype's smallest normal) to 1e20 (or the top of `extreme`).
"""

Nonfinite = Literal["propagate", "not_applicable"]
"""What a problem's reference does with NaN and +-Inf inputs: `propagate` (its float64 NaN
and infinities are the expected outputs) or `not_applicable` (never given them)."""

SPECIALS: tuple[float, ...] = (math.nan, math.inf, -math.inf)
MASK_VALUE = -1e9
"""The value attention masks write before a softmax."""
OUTLIER_MAGNITUDE = 1e6

ShapeDrawer = Callable[[np.random.Generator], tuple[dict[str, int], ...]]


class _Dtypes(Mapping[str, type[Any]]):
    """fp32, bf16 and fp16; ml_dtypes (a second to import) is loaded only for bf16."""

    def __getitem__(self, name: str) -> type[Any]:
        if name == "bf16":
            import ml_dtypes

            return ml_dtypes.bfloat16
        return {"fp32": np.float32, "fp16": np.float16}[name]

    def __iter__(self) -> Iterator[str]:
        return iter(("fp32", "bf16", "fp16"))

    def __len__(self) -> int:
        return 3


DTYPES: Mapping[str, type[Any]] = _Dtypes()
"""Element types, by the name campaigns use. Kernels take and return arrays of one dtype."""


class ProblemError(ValueError):
    """The problem itself is wrong (its reference, its shapes), never the kernel."""


def finfo(dtype: str) -> Any:
    """The limits of an element type (ml_dtypes' finfo knows bf16, numpy's the others)."""
    if dtype == "bf16":
        import ml_dtypes

        return ml_dtypes.finfo(DTYPES[dtype])
    return np.finfo(DTYPES[dtype])


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


#: An honest fp32 kernel's error on an output element, in units in the last place of the
#: largest output of its row: what the default error scale allows at least.
ROW_ULPS = 16.0
FP32_EPSILON = 2.0**-23


def row_scale(expected: Array, rtol: float) -> Array:
    """The default error scale: |expected| per element, but at least the share of its
    row's largest finite |expected| (the last axis; a vector is one row) for which `rtol`
    allows `ROW_ULPS` fp32 ulps of it. A value that cancels to almost nothing (a
    log-sum-exp near 0, a SwiGLU whose gate underflows) is judged by the rounding its
    row's magnitudes carry, not by its own tiny magnitude."""
    magnitude = np.abs(np.asarray(expected, dtype=np.float64))
    if magnitude.size == 0:
        return magnitude
    finite = np.where(np.isfinite(magnitude), magnitude, 0.0)
    rows = finite.max(axis=-1, keepdims=True) if finite.ndim > 1 else finite.max(keepdims=True)
    with np.errstate(invalid="ignore"):
        return np.maximum(magnitude, rows * (ROW_ULPS * FP32_EPSILON / rtol))


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
    """Per-element magnitude the error is judged against (the allowed error is `atol +
    rtol * scale`, from `tolerances`); by default `row_scale`: |expected|, but never less
    than a share of the largest |expected| of the element's row, so that an element that
    nearly cancels is allowed the rounding of its row's magnitude."""
    graph: tuple[str, ...] = ()
    """For graph problems: the chain of elementary ops a fuser may fuse."""
    spec: str = ""
    """How to load it again in another process: a built-in name or `path.py:NAME`."""
    nonfinite: Nonfinite = "propagate"
    """propagate: inputs from the `nonfinite` distribution hold NaN and infinities, and the
    float64 reference's own NaN / +-Inf outputs are the expected ones (a kernel must give
    NaN exactly there, and the same infinity). not_applicable: never drawn."""
    nonfinite_inputs: tuple[float, ...] = SPECIALS
    """The special values the `nonfinite` distribution sprinkles (a problem whose honest
    formulations disagree on one, e.g. gelu(-Inf), leaves it out and says so)."""
    input_limit: float | None = None
    """The largest input magnitude `extreme` and `spread` reach; None: half the dtype's
    largest finite value. Set where fp32 intermediates of any correct kernel (a sum of
    squares) would overflow beyond it."""
    supported_distributions: tuple[str, ...] | None = None
    """The distributions a custom `make_inputs` can draw; None: all of DISTRIBUTIONS."""
    draw_shapes: ShapeDrawer | None = None
    """Test shapes drawn per check from the check's seed, besides the fixed `test_shapes`;
    None: `spread_shapes` over the dims (one dim large at a time, page rows, ragged).
    Drawn shapes are moved to meet the `constraints` (`shape_rules.fitted`)."""
    derived: Mapping[str, str] = field(default_factory=dict)
    """Dims computed from the others, as expressions: `{"half": "cols // 2"}`. Arguments
    may use them; shapes never give them and the kernel is not passed them."""
    constraints: tuple[str, ...] = ()
    """Conditions every shape must meet, over dims and derived dims: `("cols % 2 == 0",)`.
    Test shapes and campaign shapes that break one are refused."""
    contract_shapes: ShapeDrawer | None = None
    """Shapes that cover the contract, drawn per check besides the test shapes, each
    verified once on `normal` inputs (a single call: they are large): both dims large, the
    last dim wide, and at least 2^20 elements. None: none drawn."""
    envelope: str = ""
    """The shapes a check verifies on, in words: `kfactory check` prints it and `kfactory
    best` writes it in the kernel's header."""
    rows_independent: bool = True
    """Each row (along the first dim) of every output depends only on the same row of the
    inputs that have that dim, and on the whole of the others: every timed call is then
    judged on a few rows (`gpu_workers.sampled_rows`). False where that does not hold."""

    @property
    def load_spec(self) -> str:
        return self.spec or self.name

    @property
    def distributions(self) -> tuple[str, ...]:
        """The distributions this problem is verified over, in DISTRIBUTIONS order."""
        allowed = set(self.supported_distributions or DISTRIBUTIONS)
        if self.nonfinite == "not_applicable":
            allowed.discard("nonfinite")
        return tuple(d for d in DISTRIBUTIONS if d in allowed)

    def trial_shapes(self, rng: np.random.Generator) -> tuple[dict[str, int], ...]:
        """The fixed edge shapes, then the shapes drawn for one check from `rng` (moved to
        meet the constraints), each with its derived dims."""
        drawn = (self.draw_shapes or (lambda r: spread_shapes(self.dims, r)))(rng)
        fitted = []
        for shape in drawn:
            if not (self.derived or self.constraints):
                fitted.append(dict(shape))
                continue
            moved = shape_rules.fitted(self.dims, self.derived, self.constraints, shape)
            if moved is None:
                faults = "; ".join(self.shape_faults(shape))
                raise ProblemError(f"{self.load_spec}: no drawn shape near {shape}: {faults}")
            fitted.append(moved)
        return tuple(self.full_shape(s) for s in (*self.test_shapes, *fitted))

    def contract_trial_shapes(self, rng: np.random.Generator) -> tuple[dict[str, int], ...]:
        """The contract shapes drawn for one check from `rng`, each with its derived dims."""
        drawn = self.contract_shapes(rng) if self.contract_shapes is not None else ()
        return tuple(self.full_shape(s) for s in drawn)

    def full_shape(self, shape: Shape) -> dict[str, int]:
        """`shape`'s dims with the derived dims computed."""
        if not self.derived:
            return {d: int(shape[d]) for d in self.dims}
        return shape_rules.full_shape(self.dims, self.derived, shape)

    def shape_faults(self, shape: Shape) -> list[str]:
        """What a shape breaks (missing dims, a derived dim not a positive integer, a
        constraint), one line each; empty for a shape the problem can be run at."""
        return shape_rules.broken(self.dims, self.derived, self.constraints, shape)

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
        """Fresh inputs for one trial, already in the kernel's dtype. The single entry point
        for every input a kernel is judged on (verification and the benchmark's re-check)."""
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {distribution!r}; known: {DISTRIBUTIONS}")
        if distribution not in self.distributions:
            raise ValueError(
                f"{self.name} is not verified over {distribution!r}; it takes {self.distributions}"
            )
        rng = np.random.default_rng(seed)
        shape = self.full_shape(shape)
        if self.make_inputs is not None:
            raw = self.make_inputs(shape, distribution, rng)
        else:
            raw = {
                a.name: fill(
                    a.shape(shape),
                    distribution,
                    rng,
                    dtype,
                    limit=self.input_limit,
                    specials=self.nonfinite_inputs,
                )
                for a in self.inputs
            }
        return {a.name: to_dtype(raw[a.name], dtype) for a in self.inputs}

    def expected(self, inputs: Arrays) -> Arrays:
        """The float64 reference; NaN and infinities it produces are part of the answer.
        A reference that fails, or misses an output, raises ProblemError: the problem is
        wrong, not the kernel."""
        as64 = {k: v.astype(np.float64) for k, v in inputs.items()}
        try:
            with np.errstate(all="ignore"):
                outputs = self.reference(as64)
        except Exception as exc:
            raise ProblemError(
                f"{self.load_spec}: the reference raised {type(exc).__name__}: {exc}"
            ) from exc
        missing = [a.name for a in self.outputs if a.name not in outputs]
        if missing:
            raise ProblemError(f"{self.load_spec}: the reference returns no {missing}")
        return outputs

    def scales(self, inputs: Arrays, expected: Arrays) -> Arrays:
        """The magnitude each output element's error is judged against: the problem's
        `error_scale`, or by default `row_scale` (never less than |expected|)."""
        if self.error_scale is None:
            rtol = self.tolerances["fp32"].rtol
            return {k: row_scale(v, rtol) for k, v in expected.items()}
        as64 = {k: v.astype(np.float64) for k, v in inputs.items()}
        with np.errstate(all="ignore"):
            return self.error_scale(as64, expected)

    def cost_for(self, shape: Shape, dtype: str = "fp32") -> Cost:
        """`cost` counts fp32 bytes; the traffic of another dtype scales with its size."""
        cost = self.cost(self.full_shape(shape))
        itemsize = np.dtype(DTYPES[dtype]).itemsize
        return Cost(bytes_moved=cost.bytes_moved * itemsize // 4, flops=cost.flops)

    def nbytes(self, shape: Shape, dtype: str = "fp32") -> int:
        itemsize = np.dtype(DTYPES[dtype]).itemsize
        full = self.full_shape(shape)
        return sum(int(np.prod(a.shape(full))) * itemsize for a in self.args)


def to_dtype(values: Array, dtype: str) -> Array:
    """Values in a dtype: finite values beyond its range clipped to its largest finite value
    (a finite input stays a finite number in the kernel's type, never an overflowed
    infinity); infinities and NaN that were drawn on purpose are kept."""
    np_dtype = DTYPES[dtype]
    largest = float(finfo(dtype).max)
    clipped = np.clip(values, -largest, largest)
    infinite = np.isinf(values)
    if infinite.any():
        clipped = np.where(infinite, values, clipped)
    return np.ascontiguousarray(clipped.astype(np_dtype, copy=False))


def _rows(values: Array) -> Array:
    """A view of an array as rows along its last axis (a vector is one row)."""
    return values.reshape(-1, values.shape[-1]) if values.ndim else values.reshape(1, 1)


def _sprinkle_specials(
    values: Array, specials: tuple[float, ...], rng: np.random.Generator
) -> Array:
    """NaN / +-Inf at a few places: about one row in eight of a matrix (so most rows and
    columns of any output stay finite), one element in 64 of a vector."""
    if not specials or values.size == 0:
        return values
    rows = _rows(values)
    count = max(1, min(rows.shape) // 8) if values.ndim >= 2 else max(1, values.size // 64)
    where = rng.integers(0, values.size, count)
    flat = values.reshape(-1)
    flat[where] = np.asarray(specials, dtype=values.dtype)[rng.integers(0, len(specials), count)]
    # A row of -Inf only has no maximum: softmax is 0/0 there, and honest formulations
    # (max-subtracted from -FLT_MAX, online) differ. Such a row becomes NaN.
    touched = np.unique(where // rows.shape[1])
    lost = touched[np.all(rows[touched] == -np.inf, axis=1)]
    rows[lost] = np.nan
    return values


def _mixed(values: Array, rng: np.random.Generator) -> Array:
    """Attention-style rows: masks of MASK_VALUE (whole rows, at least one of them;
    suffixes; scattered) and a few outliers of ~OUTLIER_MAGNITUDE among ordinary values."""
    rows = _rows(values)
    count, width = rows.shape
    if values.ndim >= 2:
        kind: Array = rng.integers(0, 8, (count, 1))  # 0 whole row, 1-3 suffix, 4-5 scattered
        start = rng.integers(0, width + 1, (count, 1))
        cols = np.arange(width)[None, :]
        kind[rng.integers(0, count)] = 0  # at least one row masked throughout
        mask = (kind == 0) | ((kind <= 3) & (cols >= start))
        mask |= (kind >= 4) & (kind <= 5) & (rng.random(rows.shape, dtype=np.float32) < 0.25)
    else:
        mask = rng.random(rows.shape, dtype=np.float32) < 0.125
    outlier = (rng.random(rows.shape, dtype=np.float32) < 1 / 128) & ~mask
    n = int(outlier.sum())
    magnitude = OUTLIER_MAGNITUDE * np.exp2(rng.random(n, dtype=np.float32) * 2 - 1)
    rows[outlier] = np.where(rng.random(n) < 0.5, -magnitude, magnitude)
    rows[mask] = MASK_VALUE
    return values


def _with_exponents(exponent: Array, raw: Array) -> Array:
    """float32 values (1 + m) * 2**exponent, their mantissa m and sign from the random bits
    `raw` (uint32), built from bits: fast at 4096x4096, and exact down to the smallest
    denormal (below 2**-126 the mantissa is shifted into a denormal)."""
    field = exponent.astype(np.int32)
    field += 127
    below = field < 1
    np.maximum(field, 1, out=field)
    out = field.view(np.uint32)
    out <<= np.uint32(23)
    out |= raw & np.uint32(0x807FFFFF)  # sign and mantissa
    if below.any():
        where = np.flatnonzero(below)
        shift = (1 - exponent.reshape(-1)[where].astype(np.int32) - 127).clip(0, 31)
        mantissa = (raw.reshape(-1)[where] & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
        sign = raw.reshape(-1)[where] & np.uint32(0x80000000)
        out.reshape(-1)[where] = (mantissa >> shift.astype(np.uint32)) | sign
    return out.view(np.float32)


def fill(
    shape: tuple[int, ...],
    distribution: str,
    rng: np.random.Generator,
    dtype: str = "fp32",
    *,
    limit: float | None = None,
    specials: tuple[float, ...] = SPECIALS,
) -> Array:
    """Values of one array drawn from a named distribution (float32: every distribution is
    exact in it, and a 4096x4096 array needs no float64 temporaries). `dtype` and `limit`
    set the range of `extreme` and `spread`; `specials` what `nonfinite` sprinkles."""
    f32 = np.float32
    if distribution == "normal":
        return rng.standard_normal(shape, dtype=f32)
    if distribution == "uniform":
        return rng.random(shape, dtype=f32) * f32(2.0) - f32(1.0)
    if distribution == "large":
        return rng.standard_normal(shape, dtype=f32) * f32(1e4)
    if distribution == "tiny":
        return rng.standard_normal(shape, dtype=f32) * f32(1e-15)
    if distribution == "ties":
        table = np.array([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0], dtype=f32)
        values = table[rng.integers(0, len(table), shape, dtype=np.int8)]
        if len(shape) >= 2 and shape[0] > 0:
            values[0, ...] = 1.0  # a constant row: every element ties
        return values
    if distribution == "nonfinite":
        return _sprinkle_specials(rng.standard_normal(shape, dtype=f32), specials, rng)
    if distribution == "mixed":
        return _mixed(rng.standard_normal(shape, dtype=f32), rng)
    info = finfo(dtype)
    top = min(float(info.max) / 2, limit if limit is not None else math.inf)
    smallest_normal = float(info.smallest_normal)
    raw = rng.integers(0, 1 << 32, shape, dtype=np.uint32)  # mantissa, sign, 8 spare bits
    if distribution == "extreme":
        # |x| in [top / 128, 2 top): 2**e (1 + m), e among the 8 binades up to top, for
        # half the values; the others from 1/16 of the dtype's smallest normal to 16x it,
        # half of those denormal. Not deeper: a denormal of a few significant bits times a
        # huge value (x * w) is a normal number no fp32 kernel can compute to 1e-4.
        high = math.floor(math.log2(top))
        low = round(math.log2(smallest_normal))
        bits = (raw >> np.uint32(23)).astype(np.int16)  # the 8 spare bits: 23 to 30
        denormal = rng.integers(low - 4, low, shape, dtype=np.int16)
        tiny = np.where(bits & 2, denormal, low + ((bits >> 2) & 3))  # half of them denormal
        exponent = np.where(bits & 1, high - ((bits >> 4) & 7), tiny)
        return _with_exponents(exponent, raw)
    if distribution == "spread":
        low2 = math.ceil(math.log2(10.0 ** max(-20.0, math.log10(smallest_normal))))
        high2 = math.floor(math.log2(10.0 ** min(20.0, math.log10(top)))) - 1
        return _with_exponents(rng.integers(low2, high2 + 1, shape, dtype=np.int16), raw)
    raise ValueError(f"unknown distribution {distribution!r}")


def spread_shapes(dims: tuple[str, ...], rng: np.random.Generator) -> tuple[dict[str, int], ...]:
    """A default spread of drawn test shapes for any dims: each dim in turn large (1025 to
    4096, not a multiple of 16) with the others small; the last dim a whole number of 4 KiB
    pages of fp32 (1024 elements); every dim ragged between 2 and 64."""
    shapes: list[dict[str, int]] = []
    for big in dims:
        shapes.append(
            {d: ragged(rng, 1025, 4097) if d == big else int(rng.integers(1, 9)) for d in dims}
        )
    pages = {d: int(rng.integers(1, 5)) for d in dims}
    pages[dims[-1]] = 1024 * int(rng.integers(1, 3))
    shapes.append(pages)
    shapes.append({d: int(rng.integers(2, 65)) for d in dims})
    return tuple(shapes)


def ragged(rng: np.random.Generator, low: int, high: int) -> int:
    """An integer in [low, high) that is not a multiple of 16 (no tile divides it)."""
    value = int(rng.integers(low, high))
    return value if value % 16 else value + 1 + int(rng.integers(0, 15))
