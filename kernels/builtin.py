"""The built-in problem library."""

from __future__ import annotations

import math

import numpy as np

from kernels.spec import Arg, Arrays, Cost, Problem, Shape, fill, ragged

RMSNORM_EPS = 1e-6
LAYERNORM_EPS = 1e-5
GELU_C = math.sqrt(2.0 / math.pi)
GELU_TAIL_FLOOR = 1e-3
"""The naive fp32 tanh form loses relative accuracy where gelu(x) -> 0 for x << 0;
errors there are judged against 1e-3*|x| as well as |gelu(x)|."""

ROW_TEST_SHAPES: tuple[dict[str, int], ...] = (
    {"rows": 4, "cols": 64},  # buffers end exactly at a guard page
    {"rows": 1, "cols": 1},
    {"rows": 3, "cols": 7},
    {"rows": 37, "cols": 1000},
)
ROW_DEFAULT = {"rows": 4096, "cols": 4096}

SQUARES_LIMIT = 1e16
"""The largest input magnitude of problems that sum squares in fp32 (rmsnorm, layernorm):
beyond it the sum of squares of a 16k-wide row overflows fp32 in any plain formulation, and
a kernel is not asked to rescale its rows."""


def _row_shapes(rng: np.random.Generator) -> tuple[dict[str, int], ...]:
    """Row shapes drawn per check: tall, wide and ragged, whole 4 KiB pages per row, and a
    bulk shape (the largest: the race-stress shape). At most ~0.15M elements each, so that
    the float64 reference of a whole check stays cheap."""
    return (
        {"rows": int(rng.integers(1025, 2049)), "cols": int(rng.integers(1, 34))},  # tall
        {"rows": int(rng.integers(1, 5)), "cols": ragged(rng, 1025, 8193)},  # wide, ragged
        {"rows": int(rng.integers(2, 9)), "cols": 1024 * int(rng.choice([1, 2, 4]))},  # pages
        {"rows": int(rng.integers(40, 129)), "cols": ragged(rng, 600, 1201)},  # bulk
    )


def _row_contract(rng: np.random.Generator) -> tuple[dict[str, int], ...]:
    """The shapes that cover a row problem's contract, verified once each: both dims large,
    cols beyond 8192 (and beyond 8208, a vector loop's tail past it), and 2^20 elements
    or more."""
    return (
        {"rows": ragged(rng, 256, 513), "cols": ragged(rng, 256, 513)},
        {"rows": int(rng.integers(1, 5)), "cols": ragged(rng, 8209, 16385)},
        {"rows": int(rng.integers(1025, 1101)), "cols": int(rng.integers(1024, 1101))},
    )


ROW_ENVELOPE = (
    "rows 1-2048 by cols 1-16384: tall (rows 1025-2048, cols 1-33), wide (cols up to 8192 "
    "and 8209-16384), both dims 256-512, and 1025-1100 by 1024-1100 (at least 2^20 elements)"
)


def _n(shape: Shape, *dims: str) -> int:
    return math.prod(int(shape[d]) for d in dims)


# softmax over rows ------------------------------------------------------------------


def _softmax(inputs: Arrays) -> Arrays:
    x = inputs["x"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True)}


SOFTMAX = Problem(
    name="softmax",
    description=(
        "Softmax over each row: y[r, c] = exp(x[r,c] - m_r) / sum_c exp(x[r,c] - m_r), "
        "m_r the row max. Non-finite input propagates as in float64: a row holding NaN or "
        "+Inf is NaN throughout (+Inf - +Inf); -Inf gives 0 where it is."
    ),
    dims=("rows", "cols"),
    args=(Arg("x", ("rows", "cols")), Arg("y", ("rows", "cols"), output=True)),
    reference=_softmax,
    baseline=_softmax,
    test_shapes=ROW_TEST_SHAPES,
    default_shape=ROW_DEFAULT,
    draw_shapes=_row_shapes,
    contract_shapes=_row_contract,
    envelope=ROW_ENVELOPE,
    cost=lambda s: Cost(bytes_moved=8 * _n(s, "rows", "cols"), flops=5 * _n(s, "rows", "cols")),
)


# rmsnorm ----------------------------------------------------------------------------


def _rmsnorm(inputs: Arrays) -> Arrays:
    x, w = inputs["x"], inputs["w"]
    ms = np.mean(x * x, axis=1, keepdims=True, dtype=x.dtype)
    return {"y": (x / np.sqrt(ms + x.dtype.type(RMSNORM_EPS))) * w}


RMSNORM = Problem(
    name="rmsnorm",
    description=(
        f"Row RMS norm times a weight: y = x / sqrt(mean(x^2) + {RMSNORM_EPS}) * w. "
        "Non-finite input propagates as in float64 (a row with NaN is NaN, a row with an "
        "infinity is 0 except NaN at the infinity; a NaN or infinite weight spoils its "
        f"column). Inputs stay within {SQUARES_LIMIT:g} in magnitude."
    ),
    dims=("rows", "cols"),
    args=(
        Arg("x", ("rows", "cols")),
        Arg("w", ("cols",)),
        Arg("y", ("rows", "cols"), output=True),
    ),
    reference=_rmsnorm,
    baseline=_rmsnorm,
    test_shapes=ROW_TEST_SHAPES,
    default_shape=ROW_DEFAULT,
    input_limit=SQUARES_LIMIT,
    draw_shapes=_row_shapes,
    contract_shapes=_row_contract,
    envelope=ROW_ENVELOPE,
    cost=lambda s: Cost(
        bytes_moved=4 * (2 * _n(s, "rows", "cols") + _n(s, "cols")),
        flops=4 * _n(s, "rows", "cols"),
    ),
)


# layernorm --------------------------------------------------------------------------


def _layernorm(inputs: Arrays) -> Arrays:
    x, w, b = inputs["x"], inputs["w"], inputs["b"]
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return {"y": (x - mean) / np.sqrt(var + x.dtype.type(LAYERNORM_EPS)) * w + b}


def _layernorm_rounding(inputs: Arrays) -> np.ndarray:
    """How large y's error may be from rounding alone: fp32 `x - mean` is only exact to
    eps * (|x| + the error of the fp32 mean), and a row sum is only exact to eps times the
    sum of the magnitudes it adds (mean |x|, not |mean|: huge values of both signs cancel
    in the mean but not in its rounding), scaled by w / std. Where x nearly equals the row
    mean, |y| is far smaller than that, and judging against |y| alone rejects correct
    kernels."""
    x, w = inputs["x"], inputs["w"]
    mean = x.mean(axis=1, keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + LAYERNORM_EPS)
    return np.abs(w) * (np.abs(x) + np.abs(x).mean(axis=1, keepdims=True)) / std


LAYERNORM = Problem(
    name="layernorm",
    description=(
        f"Layer norm of each row: y = (x - mean) / sqrt(var + {LAYERNORM_EPS}) * w + b "
        "(biased variance). Non-finite input propagates as in float64: a row holding NaN "
        "or an infinity is NaN; a NaN or infinite weight or bias spoils its column. Inputs "
        f"stay within {SQUARES_LIMIT:g} in magnitude."
    ),
    dims=("rows", "cols"),
    args=(
        Arg("x", ("rows", "cols")),
        Arg("w", ("cols",)),
        Arg("b", ("cols",)),
        Arg("y", ("rows", "cols"), output=True),
    ),
    reference=_layernorm,
    baseline=_layernorm,
    test_shapes=ROW_TEST_SHAPES,
    default_shape=ROW_DEFAULT,
    input_limit=SQUARES_LIMIT,
    draw_shapes=_row_shapes,
    contract_shapes=_row_contract,
    envelope=ROW_ENVELOPE,
    cost=lambda s: Cost(
        bytes_moved=4 * (2 * _n(s, "rows", "cols") + 2 * _n(s, "cols")),
        flops=8 * _n(s, "rows", "cols"),
    ),
    error_scale=lambda i, e: {"y": np.abs(e["y"]) + _layernorm_rounding(i)},
)


# gelu (tanh) ------------------------------------------------------------------------


def _gelu(x: np.ndarray) -> np.ndarray:
    c = x.dtype.type(GELU_C)
    return x.dtype.type(0.5) * x * (1 + np.tanh(c * (x + x.dtype.type(0.044715) * x * x * x)))


GELU = Problem(
    name="gelu",
    description=(
        "GELU, tanh form: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). "
        "gelu(NaN) = NaN and gelu(+Inf) = +Inf are demanded; -Inf is never given: the "
        "tanh form gives -Inf * 0 = NaN there, the sigmoid form x / (1 + exp(-2u)) -Inf, "
        "the limit is 0, and honest kernels differ."
    ),
    dims=("n",),
    args=(Arg("x", ("n",)), Arg("y", ("n",), output=True)),
    reference=lambda i: {"y": _gelu(i["x"])},
    baseline=lambda i: {"y": _gelu(i["x"])},
    test_shapes=({"n": 256}, {"n": 1}, {"n": 7}, {"n": 10007}),
    default_shape={"n": 1 << 24},
    nonfinite_inputs=(math.nan, math.inf),
    draw_shapes=lambda rng: (
        {"n": ragged(rng, 100_001, 400_001)},  # long and ragged: the race-stress shape
        {"n": 1024 * int(rng.integers(1, 65))},  # whole 4 KiB pages
        {"n": ragged(rng, 1025, 4097)},
    ),
    cost=lambda s: Cost(bytes_moved=8 * _n(s, "n"), flops=10 * _n(s, "n")),
    error_scale=lambda i, e: {"y": np.abs(e["y"]) + GELU_TAIL_FLOOR * np.abs(i["x"])},
    contract_shapes=lambda rng: ({"n": ragged(rng, 1 << 20, (1 << 20) + 4097)},),
    envelope="n 1-(2^20 + 4096): short, ragged, whole pages, and at least 2^20 elements",
)


# matmul -----------------------------------------------------------------------------

FP32_SMALLEST_NORMAL = float(np.finfo(np.float32).smallest_normal)
DENORMAL_WEIGHT = 1e4
"""A kernel may read fp32 denormal inputs as zero (DAZ under -ffast-math, FTZ on GPUs):
products with a denormal factor are allowed in full, 1 / rtol (fp32) times their size."""


def _matmul_scale(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_k |a_ik| |b_kj|, plus the products with a denormal factor in full."""
    a, b = np.abs(a), np.abs(b)
    scale = a @ b
    tiny_a = np.where(a < FP32_SMALLEST_NORMAL, a, 0.0)
    tiny_b = np.where(b < FP32_SMALLEST_NORMAL, b, 0.0)
    if tiny_a.any() or tiny_b.any():
        scale = scale + DENORMAL_WEIGHT * (tiny_a @ b + a @ tiny_b)
    return scale


MATMUL = Problem(
    name="matmul",
    description=(
        "fp32 matrix product C = A @ B, row-major; A is MxK, B is KxN, C is MxN. Non-finite "
        "input propagates as in float64 (NaN spreads along its row of A or column of B; "
        "Inf * 0 and Inf - Inf are NaN). Inputs stay within 1e16 in magnitude (products and "
        "sums of any plain fp32 formulation stay finite)."
    ),
    dims=("M", "N", "K"),
    args=(Arg("A", ("M", "K")), Arg("B", ("K", "N")), Arg("C", ("M", "N"), output=True)),
    reference=lambda i: {"C": i["A"] @ i["B"]},
    baseline=lambda i: {"C": i["A"] @ i["B"]},
    test_shapes=(
        {"M": 16, "N": 16, "K": 16},
        {"M": 1, "N": 1, "K": 1},
        {"M": 3, "N": 5, "K": 7},
        {"M": 33, "N": 65, "K": 17},
        {"M": 70, "N": 100, "K": 50},
    ),
    default_shape={"M": 2048, "N": 2048, "K": 2048},
    input_limit=SQUARES_LIMIT,
    draw_shapes=lambda rng: (
        {
            "M": ragged(rng, 1025, 2049),
            "N": int(rng.integers(1, 17)),
            "K": int(rng.integers(1, 33)),
        },
        {"M": int(rng.integers(1, 9)), "N": ragged(rng, 1025, 4097), "K": int(rng.integers(1, 33))},
        {"M": int(rng.integers(1, 9)), "N": int(rng.integers(1, 17)), "K": ragged(rng, 1025, 4097)},
        {"M": int(rng.integers(2, 9)), "N": 1024, "K": int(rng.integers(2, 65))},  # page rows
        {"M": ragged(rng, 100, 201), "N": ragged(rng, 100, 201), "K": ragged(rng, 100, 301)},
    ),
    cost=lambda s: Cost(
        bytes_moved=4 * (_n(s, "M", "K") + _n(s, "K", "N") + _n(s, "M", "N")),
        flops=2 * _n(s, "M", "N", "K"),
    ),
    # Cancellation makes |C| meaningless as a scale; fp32 error grows with sum |a||b|.
    error_scale=lambda i, e: {"C": _matmul_scale(i["A"], i["B"])},
    contract_shapes=lambda rng: (
        {"M": ragged(rng, 256, 385), "N": ragged(rng, 256, 385), "K": ragged(rng, 256, 385)},
        {
            "M": int(rng.integers(1, 5)),
            "N": int(rng.integers(1, 65)),
            "K": ragged(rng, 8209, 16385),
        },
        {"M": ragged(rng, 1025, 1101), "N": ragged(rng, 1024, 1101), "K": int(rng.integers(1, 9))},
    ),
    envelope=(
        "M, N, K 1-4096 and K up to 16384: each dim long with the others small, all three "
        "256-384, K 8209-16384, and an M x N output of at least 2^20 elements"
    ),
)


# graph: residual add -> rmsnorm -> gelu ----------------------------------------------


def _residual_rmsnorm_gelu_pre(inputs: Arrays) -> np.ndarray:
    h = inputs["x"] + inputs["r"]
    return _rmsnorm({"x": h, "w": inputs["w"]})["y"]


RESIDUAL_RMSNORM_GELU = Problem(
    name="residual_rmsnorm_gelu",
    description=(
        "Graph: h = x + r; u = rmsnorm(h) * w (eps 1e-6); y = gelu_tanh(u). "
        "A fuser can do it in one pass over each row. NaN propagates (a row with NaN is "
        "NaN, a NaN weight spoils its column); infinities are never given (an infinite "
        "weight makes u = -Inf, where gelu forms differ). Inputs stay within 1e16."
    ),
    dims=("rows", "cols"),
    args=(
        Arg("x", ("rows", "cols")),
        Arg("r", ("rows", "cols")),
        Arg("w", ("cols",)),
        Arg("y", ("rows", "cols"), output=True),
    ),
    reference=lambda i: {"y": _gelu(_residual_rmsnorm_gelu_pre(i))},
    baseline=lambda i: {"y": _gelu(_residual_rmsnorm_gelu_pre(i))},
    test_shapes=ROW_TEST_SHAPES,
    default_shape=ROW_DEFAULT,
    input_limit=SQUARES_LIMIT,
    nonfinite_inputs=(math.nan,),
    draw_shapes=_row_shapes,
    contract_shapes=_row_contract,
    envelope=ROW_ENVELOPE,
    cost=lambda s: Cost(
        bytes_moved=4 * (3 * _n(s, "rows", "cols") + _n(s, "cols")),
        flops=16 * _n(s, "rows", "cols"),
    ),
    error_scale=lambda i, e: {
        "y": np.abs(e["y"]) + GELU_TAIL_FLOOR * np.abs(_residual_rmsnorm_gelu_pre(i))
    },
    graph=("add", "rmsnorm", "gelu"),
)


# KDA: Kimi Delta Attention, recurrent gated delta rule -------------------------------


def _kda_recurrence(inputs: Arrays) -> tuple[np.ndarray, np.ndarray]:
    """Outputs o [B,T,H,V] and the magnitude each is judged against: sum_k |scale q_k| W_kv,
    W the weight of the terms the state was last built from (|S decayed| and |k| |beta|
    (|v| + |k|^T |S decayed|), where fp32 cancels), decaying with the gate, never below
    |S|. With one key channel or after cancellation, |S| alone is far below the rounding
    error of an honest fp32 recurrence."""
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    batch, steps, heads, dk = q.shape
    dv = v.shape[-1]
    scale = q.dtype.type(1.0 / math.sqrt(dk))
    state = np.zeros((batch, heads, dk, dv), dtype=q.dtype)
    weight = np.zeros_like(state)
    o = np.empty((batch, steps, heads, dv), dtype=q.dtype)
    magnitude = np.empty_like(o)
    for t in range(steps):
        decay = np.exp(g[:, t])[..., None]
        decayed = state * decay
        kt, bt = k[:, t], beta[:, t][..., None]
        predicted = np.einsum("bhk,bhkv->bhv", kt, decayed)
        delta = bt * (v[:, t] - predicted)
        state = decayed + kt[..., None] * delta[:, :, None, :]
        qt = scale * q[:, t]
        o[:, t] = np.einsum("bhk,bhkv->bhv", qt, state)
        akt, adecayed = np.abs(kt), np.abs(decayed)
        terms = np.abs(bt) * (np.abs(v[:, t]) + np.einsum("bhk,bhkv->bhv", akt, adecayed))
        weight = np.maximum(weight * decay, adecayed + akt[..., None] * terms[:, :, None, :])
        magnitude[:, t] = np.einsum("bhk,bhkv->bhv", np.abs(qt), weight)
    return o, magnitude


KDA_DISTRIBUTIONS = ("normal", "uniform", "large", "tiny", "ties", "nonfinite", "mixed")
"""Not `extreme`: values near FLT_MAX in q and v overflow the state of any fp32 recurrence.
Not `spread`: the delta rule subtracts k^T S from v at every step, and with values across
40 decades an honest fp32 recurrence loses more than the |q| |S| bound allows."""


def _kda_inputs(shape: Shape, distribution: str, rng: np.random.Generator) -> Arrays:
    """q and v from the distribution (NaN / +-Inf only there, under `nonfinite`); keys
    L2-normalised and the gate g = log-sigmoid < 0 drawn from its finite part (mask values
    -1e9 under `mixed` are hard resets, g = -1e9); beta = sigmoid of N(0, 1) under
    `nonfinite` and `mixed` (a masked beta of 1e-22 would only measure exp(-1e9) ~ 0)."""
    b, t, h, dk, dv = (int(shape[d]) for d in ("B", "T", "H", "K", "V"))
    finite = "normal" if distribution == "nonfinite" else distribution
    plain = "normal" if distribution in ("nonfinite", "mixed") else distribution

    def draw(dims: tuple[int, ...], kind: str) -> np.ndarray:
        return fill(dims, kind, rng)

    k = draw((b, t, h, dk), plain).astype(np.float64)
    norm = np.sqrt((k * k).sum(axis=-1, keepdims=True))
    return {
        "q": draw((b, t, h, dk), distribution),
        "k": k / np.maximum(norm, 1e-30),  # L2-normalised keys keep the recurrence stable
        "v": draw((b, t, h, dv), distribution),
        "g": -np.logaddexp(0.0, -draw((b, t, h, dk), finite)),  # log-sigmoid < 0
        "beta": 1.0 / (1.0 + np.exp(-np.clip(draw((b, t, h), plain), -50, 50))),
    }


def _kda_shapes(rng: np.random.Generator) -> tuple[dict[str, int], ...]:
    small = lambda lo, hi: int(rng.integers(lo, hi))  # noqa: E731
    return (
        # a long sequence
        {"B": 1, "T": ragged(rng, 1025, 1537), "H": 1, "K": small(1, 9), "V": small(1, 9)},
        # over 1024 (batch, head) pairs
        {
            "B": small(33, 65),
            "T": small(2, 5),
            "H": small(17, 33),
            "K": small(1, 5),
            "V": small(1, 9),
        },
        # a wide state; v and o rows of whole 4 KiB pages
        {"B": 1, "T": small(2, 5), "H": small(1, 3), "K": ragged(rng, 65, 257), "V": 1024},
        # bulk: the race-stress shape
        {
            "B": small(1, 3),
            "T": small(20, 49),
            "H": small(2, 4),
            "K": ragged(rng, 17, 81),
            "V": ragged(rng, 17, 81),
        },
    )


KDA = Problem(
    name="kda",
    description=(
        "Kimi Delta Attention, recurrent gated delta rule. Per batch and head, state S[K,V] = 0; "
        "for each t: S <- S * exp(g_t) (per key channel); S <- S + beta_t k_t (v_t - k_t^T S)^T; "
        "o_t = (scale q_t)^T S with scale = 1/sqrt(K). q, k, g are [B,T,H,K]; v, o are "
        "[B,T,H,V]; beta is [B,T,H]. Keys are L2-normalised, g < 0, 0 < beta < 1. "
        "NaN and infinities in q and v propagate as in float64 (through the state, to "
        "later steps); never near FLT_MAX."
    ),
    dims=("B", "T", "H", "K", "V"),
    args=(
        Arg("q", ("B", "T", "H", "K")),
        Arg("k", ("B", "T", "H", "K")),
        Arg("v", ("B", "T", "H", "V")),
        Arg("g", ("B", "T", "H", "K")),
        Arg("beta", ("B", "T", "H")),
        Arg("o", ("B", "T", "H", "V"), output=True),
    ),
    reference=lambda i: {"o": _kda_recurrence(i)[0]},
    baseline=lambda i: {"o": _kda_recurrence(i)[0]},
    test_shapes=(
        {"B": 1, "T": 4, "H": 2, "K": 8, "V": 8},
        {"B": 1, "T": 1, "H": 1, "K": 1, "V": 1},
        {"B": 1, "T": 5, "H": 2, "K": 3, "V": 7},
        {"B": 2, "T": 33, "H": 3, "K": 20, "V": 12},
    ),
    default_shape={"B": 2, "T": 256, "H": 4, "K": 64, "V": 64},
    make_inputs=_kda_inputs,
    supported_distributions=KDA_DISTRIBUTIONS,
    draw_shapes=_kda_shapes,
    contract_shapes=lambda rng: (
        {"B": 1, "T": 2, "H": 1, "K": ragged(rng, 256, 321), "V": ragged(rng, 256, 321)},
        {"B": 1, "T": 2, "H": 1, "K": int(rng.integers(1, 5)), "V": ragged(rng, 8209, 16385)},
        {"B": 1, "T": 64, "H": 16, "K": int(rng.integers(4, 9)), "V": ragged(rng, 1024, 1101)},
    ),
    envelope=(
        "B 1-64, T 1-64, H 1-32, K 1-320, V 1-16384: many heads, long sequences, a wide "
        "state, K and V both 256-320, V 8209-16384, and an output of at least 2^20 elements"
    ),
    cost=lambda s: Cost(
        bytes_moved=4
        * (3 * _n(s, "B", "T", "H", "K") + 2 * _n(s, "B", "T", "H", "V") + _n(s, "B", "T", "H")),
        flops=9 * _n(s, "B", "T", "H", "K", "V"),
    ),
    error_scale=lambda i, e: {"o": _kda_recurrence(i)[1]},
)


BUILTIN: dict[str, Problem] = {
    p.name: p for p in (SOFTMAX, RMSNORM, LAYERNORM, GELU, MATMUL, RESIDUAL_RMSNORM_GELU, KDA)
}
