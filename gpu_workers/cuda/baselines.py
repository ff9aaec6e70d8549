"""What a CUDA kernel is timed against: what its users run today.

In order of preference: torch eager (the library most users call), cupy (the same
formulas as array expressions; no bfloat16), the problem's first CUDA template for the
dtype rendered at its defaults and compiled like any kernel ("naive cuda"), and for a
problem with neither a formula nor a template (a user's problem) its numpy baseline on
the host CPU. torch and cupy count only where the device probe found them working with
CUDA. The worker picks one (`choose_baseline`); the runner builds it in the process that
owns the CUDA context, with its own copies of the same inputs, on the same (default)
stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gpu_workers.cuda.protocol import as_bits
from kernels.builtin import BUILTIN, GELU_C, LAYERNORM_EPS, RMSNORM_EPS
from kernels.design_space import Template
from kernels.spec import Arrays, Problem
from kernels.templates import templates_for

CHOICES = ("torch", "cupy", "naive_cuda", "numpy_host")
NAIVE_CUDA = "naive cuda (template defaults)"

Inputs = dict[str, Any]
Formula = Callable[[Any, Inputs], Inputs]


class Baseline(Protocol):
    name: str
    host_timed: bool
    """True when the call runs on the host and is timed by the host clock, not by events."""

    def __call__(self, index: int) -> None:
        """One call on input set `index`; enqueued on the default stream (not waited for)."""
        ...


# Array formulas: `xp` is numpy or cupy; elements stay in the input dtype, as a user's
# expression would keep them. -----------------------------------------------------------


def _softmax_xp(xp: Any, i: Inputs) -> Inputs:
    x = i["x"]
    e = xp.exp(x - x.max(axis=1, keepdims=True))
    return {"y": e / e.sum(axis=1, keepdims=True)}


def _rms_xp(xp: Any, x: Any, w: Any) -> Any:
    eps = x.dtype.type(RMSNORM_EPS)
    return x / xp.sqrt(xp.mean(x * x, axis=1, keepdims=True) + eps) * w


def _gelu_xp(xp: Any, x: Any) -> Any:
    t = x.dtype.type
    return t(0.5) * x * (t(1) + xp.tanh(t(GELU_C) * (x + t(0.044715) * x * x * x)))


def _layernorm_xp(xp: Any, i: Inputs) -> Inputs:
    x, w, b = i["x"], i["w"], i["b"]
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return {"y": (x - mean) / xp.sqrt(var + x.dtype.type(LAYERNORM_EPS)) * w + b}


def _kda_xp(xp: Any, i: Inputs) -> Inputs:
    """The recurrence of kernels.builtin's reference, in float32 whatever the inputs."""
    q, k, v, g, beta = (i[n].astype(xp.float32) for n in ("q", "k", "v", "g", "beta"))
    batch, steps, heads, dk = q.shape
    dv = v.shape[-1]
    scale = xp.float32(1.0 / math.sqrt(dk))
    state = xp.zeros((batch, heads, dk, dv), dtype=xp.float32)
    o = xp.empty((batch, steps, heads, dv), dtype=xp.float32)
    for t in range(steps):
        state = state * xp.exp(g[:, t])[..., None]
        kt = k[:, t]
        predicted = xp.einsum("bhk,bhkv->bhv", kt, state)
        delta = beta[:, t][..., None] * (v[:, t] - predicted)
        state = state + kt[..., None] * delta[:, :, None, :]
        o[:, t] = xp.einsum("bhk,bhkv->bhv", scale * q[:, t], state)
    return {"o": o.astype(i["q"].dtype)}


ARRAY_FORMULAS: dict[str, tuple[str, Formula]] = {
    "softmax": ("e = exp(x - x.max(1)); e / e.sum(1)", _softmax_xp),
    "rmsnorm": (
        "x / sqrt(mean(x*x, 1) + eps) * w",
        lambda xp, i: {"y": _rms_xp(xp, i["x"], i["w"])},
    ),
    "layernorm": ("(x - mean) / sqrt(var + eps) * w + b", _layernorm_xp),
    "gelu": ("0.5 x (1 + tanh(c (x + 0.044715 x^3)))", lambda xp, i: {"y": _gelu_xp(xp, i["x"])}),
    "matmul": ("A @ B", lambda xp, i: {"C": i["A"] @ i["B"]}),
    "residual_rmsnorm_gelu": (
        "gelu_tanh(rmsnorm(x + r) * w) as array expressions",
        lambda xp, i: {"y": _gelu_xp(xp, _rms_xp(xp, i["x"] + i["r"], i["w"]))},
    ),
    "kda": ("the recurrence as a loop over T of einsums (float32 state)", _kda_xp),
}


# Torch formulas: what a torch user calls. ---------------------------------------------


def _rms_torch(torch: Any, x: Any, w: Any) -> Any:
    functional = torch.nn.functional
    if hasattr(functional, "rms_norm"):
        return functional.rms_norm(x, (x.shape[-1],), weight=w, eps=RMSNORM_EPS)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMSNORM_EPS) * w


def _rms_text(torch: Any) -> str:
    if hasattr(torch.nn.functional, "rms_norm"):
        return "torch.nn.functional.rms_norm(x, (cols,), w, eps=1e-6)"
    return "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w"


def _gelu_torch(torch: Any, x: Any) -> Any:
    return torch.nn.functional.gelu(x, approximate="tanh")


def _layernorm_torch(torch: Any, i: Inputs) -> Inputs:
    x = i["x"]
    y = torch.nn.functional.layer_norm(
        x, (x.shape[-1],), weight=i["w"], bias=i["b"], eps=LAYERNORM_EPS
    )
    return {"y": y}


def _kda_torch(torch: Any, i: Inputs) -> Inputs:
    q, k, v, g, beta = (i[n].float() for n in ("q", "k", "v", "g", "beta"))
    batch, steps, heads, dk = q.shape
    dv = v.shape[-1]
    scale = 1.0 / math.sqrt(dk)
    state = torch.zeros((batch, heads, dk, dv), dtype=torch.float32, device=q.device)
    o = torch.empty((batch, steps, heads, dv), dtype=torch.float32, device=q.device)
    for t in range(steps):
        state = state * torch.exp(g[:, t]).unsqueeze(-1)
        kt = k[:, t]
        predicted = torch.einsum("bhk,bhkv->bhv", kt, state)
        delta = beta[:, t].unsqueeze(-1) * (v[:, t] - predicted)
        state = state + kt.unsqueeze(-1) * delta.unsqueeze(-2)
        o[:, t] = torch.einsum("bhk,bhkv->bhv", scale * q[:, t], state)
    return {"o": o.to(i["q"].dtype)}


TORCH_FORMULAS: dict[str, tuple[Callable[[Any], str], Formula]] = {
    "softmax": (lambda t: "torch.softmax(x, dim=-1)", lambda t, i: {"y": t.softmax(i["x"], -1)}),
    "rmsnorm": (_rms_text, lambda t, i: {"y": _rms_torch(t, i["x"], i["w"])}),
    "layernorm": (
        lambda t: "torch.nn.functional.layer_norm(x, (cols,), w, b, eps=1e-5)",
        _layernorm_torch,
    ),
    "gelu": (
        lambda t: "torch.nn.functional.gelu(x, approximate='tanh')",
        lambda t, i: {"y": _gelu_torch(t, i["x"])},
    ),
    "matmul": (lambda t: "A @ B", lambda t, i: {"C": i["A"] @ i["B"]}),
    "residual_rmsnorm_gelu": (
        lambda t: f"gelu(approximate='tanh') of {_rms_text(t)} on h = x + r",
        lambda t, i: {"y": _gelu_torch(t, _rms_torch(t, i["x"] + i["r"], i["w"]))},
    ),
    "kda": (
        lambda t: "the recurrence as a loop over T of torch.einsum (float32 state)",
        _kda_torch,
    ),
}


# Choosing (in the worker: nothing here imports torch or cupy). -------------------------


def has_formula(problem: Problem) -> bool:
    """Built-in problems only: a user's problem of the same name may mean anything."""
    return problem.load_spec in BUILTIN and problem.name in TORCH_FORMULAS


def naive_template(problem: Problem, dtype: str) -> Template | None:
    """The problem's first CUDA template written for `dtype` (built-in problems only)."""
    if problem.load_spec not in BUILTIN:
        return None
    return next((t for t in templates_for(problem.name, "cuda") if t.accepts(dtype)), None)


def choose_baseline(problem: Problem, dtype: str, libraries: Collection[str]) -> str:
    """One of CHOICES; `libraries` are those that work with CUDA here
    (device.cuda_libraries())."""
    if has_formula(problem) and "torch" in libraries:
        return "torch"
    if has_formula(problem) and dtype != "bf16" and "cupy" in libraries:
        return "cupy"
    if naive_template(problem, dtype) is not None:
        return "naive_cuda"
    return "numpy_host"


# Building (in the runner, inside the CUDA context). ------------------------------------


@dataclass
class LibraryBaseline:
    """A formula of TORCH_FORMULAS or ARRAY_FORMULAS, called with its library (torch or
    cupy) on device copies of the input sets."""

    name: str
    sets: list[Inputs]
    formula: Formula
    library: Any
    host_timed: bool = False

    def __call__(self, index: int) -> None:
        self.formula(self.library, self.sets[index])


@dataclass
class HostBaseline:
    name: str
    sets: list[Arrays]
    baseline: Callable[[Arrays], Arrays]
    host_timed: bool = True

    def __call__(self, index: int) -> None:
        self.baseline(self.sets[index])


def torch_baseline(problem: Problem, dtype: str, host_sets: list[Arrays]) -> LibraryBaseline:
    import torch  # type: ignore[import-not-found, unused-ignore]

    text, formula = TORCH_FORMULAS[problem.name]
    if torch.cuda.current_stream().cuda_stream != 0:
        raise RuntimeError("torch's current stream is not the default stream the timer uses")

    def to_device(array: np.ndarray) -> Any:
        if dtype == "bf16":
            return torch.from_numpy(as_bits(array, dtype).copy()).view(torch.bfloat16).cuda()
        return torch.from_numpy(np.ascontiguousarray(array).copy()).cuda()

    sets = [{k: to_device(v) for k, v in host.items()} for host in host_sets]
    return LibraryBaseline(
        name=f"torch {torch.__version__} eager: {text(torch)}",
        sets=sets,
        formula=formula,
        library=torch,
    )


def cupy_baseline(problem: Problem, dtype: str, host_sets: list[Arrays]) -> LibraryBaseline:
    import cupy  # type: ignore[import-not-found, unused-ignore]

    if dtype == "bf16":
        raise RuntimeError("cupy has no bfloat16")
    if cupy.cuda.get_current_stream().ptr != 0:
        raise RuntimeError("cupy's current stream is not the default stream the timer uses")
    text, formula = ARRAY_FORMULAS[problem.name]
    sets = [{k: cupy.asarray(v) for k, v in host.items()} for host in host_sets]
    return LibraryBaseline(
        name=f"cupy {cupy.__version__}: {text}", sets=sets, formula=formula, library=cupy
    )


def host_baseline(problem: Problem, host_sets: list[Arrays]) -> HostBaseline:
    return HostBaseline(
        name=(
            "numpy on the host CPU (problem.baseline): this problem has no torch or cupy "
            "formula and no CUDA template"
        ),
        sets=host_sets,
        baseline=problem.baseline,
    )
