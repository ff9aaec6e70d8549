"""The built-in problem library."""

from __future__ import annotations

import math

import numpy as np

from kernels.spec import Arg, Arrays, Cost, Problem, Shape, fill

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


def _n(shape: Shape, *dims: str) -> int:
    return math.prod(int(shape[d]) for d in dims)


# softmax over rows ------------------------------------------------------------------


def _softmax(inputs: Arrays) -> Arrays:
    x = inputs["x"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True)}


SOFTMAX = Problem(
    name="softmax",
    description="Softmax over each row: y[r, c] = exp(x[r,c] - m_r) / sum_c exp(x[r,c] - m_r).",
    dims=("rows", "cols"),
    args=(Arg("x", ("rows", "cols")), Arg("y", ("rows", "cols"), output=True)),
    reference=_softmax,
    baseline=_softmax,
    test_shapes=ROW_TEST_SHAPES,
    default_shape=ROW_DEFAULT,
    cost=lambda s: Cost(bytes_moved=8 * _n(s, "rows", "cols"), flops=5 * _n(s, "rows", "cols")),
)


# rmsnorm ----------------------------------------------------------------------------


def _rmsnorm(inputs: Arrays) -> Arrays:
    x, w = inputs["x"], inputs["w"]
    ms = np.mean(x * x, axis=1, keepdims=True, dtype=x.dtype)
    return {"y": (x / np.sqrt(ms + x.dtype.type(RMSNORM_EPS))) * w}


RMSNORM = Problem(
    name="rmsnorm",
    description=f"Row RMS norm times a weight: y = x / sqrt(mean(x^2) + {RMSNORM_EPS}) * w",
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
    eps * (|x| + |mean|), scaled by w / std. Where x nearly equals the row mean, |y| is
    far smaller than that, and judging against |y| alone rejects correct kernels."""
    x, w = inputs["x"], inputs["w"]
    mean = x.mean(axis=1, keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + LAYERNORM_EPS)
    return np.abs(w) * (np.abs(x) + np.abs(mean)) / std


LAYERNORM = Problem(
    name="layernorm",
    description=(
        f"Layer norm of each row: y = (x - mean) / sqrt(var + {LAYERNORM_EPS}) * w + b "
        "(biased variance)."
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
    description="GELU, tanh form: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).",
    dims=("n",),
    args=(Arg("x", ("n",)), Arg("y", ("n",), output=True)),
    reference=lambda i: {"y": _gelu(i["x"])},
    baseline=lambda i: {"y": _gelu(i["x"])},
    test_shapes=({"n": 256}, {"n": 1}, {"n": 7}, {"n": 10007}),
    default_shape={"n": 1 << 24},
    cost=lambda s: Cost(bytes_moved=8 * _n(s, "n"), flops=10 * _n(s, "n")),
    error_scale=lambda i, e: {"y": np.abs(e["y"]) + GELU_TAIL_FLOOR * np.abs(i["x"])},
)


# matmul -----------------------------------------------------------------------------


MATMUL = Problem(
    name="matmul",
    description="fp32 matrix product C = A @ B, row-major; A is MxK, B is KxN, C is MxN.",
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
    cost=lambda s: Cost(
        bytes_moved=4 * (_n(s, "M", "K") + _n(s, "K", "N") + _n(s, "M", "N")),
        flops=2 * _n(s, "M", "N", "K"),
    ),
    # Cancellation makes |C| meaningless as a scale; fp32 error grows with sum |a||b|.
    error_scale=lambda i, e: {"C": np.abs(i["A"]) @ np.abs(i["B"])},
)


# graph: residual add -> rmsnorm -> gelu ----------------------------------------------


def _residual_rmsnorm_gelu_pre(inputs: Arrays) -> np.ndarray:
    h = inputs["x"] + inputs["r"]
    return _rmsnorm({"x": h, "w": inputs["w"]})["y"]


RESIDUAL_RMSNORM_GELU = Problem(
    name="residual_rmsnorm_gelu",
    description=(
        "Graph: h = x + r; u = rmsnorm(h) * w (eps 1e-6); y = gelu_tanh(u). "
        "A fuser can do it in one pass over each row."
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
    """Outputs o [B,T,H,V] and the magnitude sum_k |scale q_k| |S_kv| each is judged against."""
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    batch, steps, heads, dk = q.shape
    dv = v.shape[-1]
    scale = q.dtype.type(1.0 / math.sqrt(dk))
    state = np.zeros((batch, heads, dk, dv), dtype=q.dtype)
    o = np.empty((batch, steps, heads, dv), dtype=q.dtype)
    magnitude = np.empty_like(o)
    for t in range(steps):
        state = state * np.exp(g[:, t])[..., None]
        kt = k[:, t]
        predicted = np.einsum("bhk,bhkv->bhv", kt, state)
        delta = beta[:, t][..., None] * (v[:, t] - predicted)
        state = state + kt[..., None] * delta[:, :, None, :]
        qt = scale * q[:, t]
        o[:, t] = np.einsum("bhk,bhkv->bhv", qt, state)
        magnitude[:, t] = np.einsum("bhk,bhkv->bhv", np.abs(qt), np.abs(state))
    return o, magnitude


def _kda_inputs(shape: Shape, distribution: str, rng: np.random.Generator) -> Arrays:
    b, t, h, dk, dv = (int(shape[d]) for d in ("B", "T", "H", "K", "V"))
    k = fill((b, t, h, dk), distribution, rng)
    norm = np.sqrt((k * k).sum(axis=-1, keepdims=True))
    return {
        "q": fill((b, t, h, dk), distribution, rng),
        "k": k / np.maximum(norm, 1e-30),  # L2-normalised keys keep the recurrence stable
        "v": fill((b, t, h, dv), distribution, rng),
        "g": -np.logaddexp(0.0, -fill((b, t, h, dk), distribution, rng)),  # log-sigmoid < 0
        "beta": 1.0 / (1.0 + np.exp(-np.clip(fill((b, t, h), distribution, rng), -50, 50))),
    }


KDA = Problem(
    name="kda",
    description=(
        "Kimi Delta Attention, recurrent gated delta rule. Per batch and head, state S[K,V] = 0; "
        "for each t: S <- S * exp(g_t) (per key channel); S <- S + beta_t k_t (v_t - k_t^T S)^T; "
        "o_t = (scale q_t)^T S with scale = 1/sqrt(K). q, k, g are [B,T,H,K]; v, o are "
        "[B,T,H,V]; beta is [B,T,H]. Keys are L2-normalised, g < 0, 0 < beta < 1."
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
