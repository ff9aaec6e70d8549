"""Messages between the worker and its sandboxed CUDA runner (files in the sandbox dir).

The file names, RunRecord and VerifyReply are every runner's: gpu_workers.runner_files.
Arrays travel as .npy files of their raw bits (uint32 for fp32, uint16 for bf16 and
fp16): numpy cannot save every element type (ml_dtypes' bfloat16) and the bits are what
the verifier compares anyway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from gpu_workers.runner_files import VerifyReply

POISON_BITS: dict[str, tuple[int, int]] = {
    "fp32": (0x7FBADBAD, 0xFFC0FFEE),
    "fp16": (0x7DAD, 0xFEED),
    "bf16": (0x7FAD, 0xFFED),
}
"""Output poison per dtype and run: two NaN payloads of the element's width, so an
unwritten element is recognisable and a run cannot pass by leaving the last one's output."""

SLACK_BYTES = 256
"""Canary bytes before and after every device array and scratch buffer."""

CALL_TIMEOUT_S = 60.0
"""A timed call's deadline when the job gives none, and what a baseline's call may take."""
KERNEL_FAULTS = ("crashed", "launch_failed", "timeout", "memory_limit", "bad_launch")
"""Reasons a runner gives for a kernel that faulted; anything else is the harness's own."""

PREPARING_BASELINE = "preparing the baseline"
SAVING_OUTPUTS = "saving judged outputs"
DONE = "done"
HARNESS_STEPS = frozenset({PREPARING_BASELINE, SAVING_OUTPUTS, DONE})
"""Progress of steps with no kernel call of the candidate pending: a runner stopped by
the wall clock during one hung on its own work."""


class TrialJob(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    shape: dict[str, int]
    distribution: str
    seed: int
    runs: int


class KernelRef(msgspec.Struct, frozen=True, kw_only=True):
    """A compiled kernel: its cubin and the source whose kf-launch lines say how to run it."""

    cubin: str
    source: str


class VerifyJob(msgspec.Struct, frozen=True, kw_only=True, tag="verify"):
    kernel: KernelRef
    problem: str
    """`Problem.load_spec`; the runner loads it with kernels.loading.load_problem."""
    dtype: str
    trials: list[TrialJob]
    launch_timeout_s: float = 20.0
    """A launch still running after this long is reported as a timeout by the runner
    itself (the sandbox's wall-clock limit stays the backstop)."""


class RecheckJob(msgspec.Struct, frozen=True, kw_only=True):
    """One call after timing on inputs the problem generates for (distribution, seed)."""

    distribution: str
    seed: int


class BenchJob(msgspec.Struct, frozen=True, kw_only=True, tag="bench"):
    kernel: KernelRef
    incumbent: KernelRef | None
    baseline: str
    """One of baselines.CHOICES, decided by the worker."""
    baseline_kernel: KernelRef | None
    """The naive CUDA baseline's build, when `baseline` is "naive_cuda"."""
    problem: str
    dtype: str
    shape: dict[str, int]
    seeds: list[int]
    """The reservoir: one input set per seed ("normal"), from which every timed call's
    inputs are drawn afresh (gpu_workers.cuda.fresh), and the pool's size."""
    rechecks: list[RecheckJob]
    secret_seed: int
    """Draws the keys of the refreshes and the judged calls; the kernel never sees it."""
    judged_calls: int
    """How many kernel calls, chosen at random, come back to be judged."""
    refresh_cubin: str
    """The harness's own refresh kernel (fresh.refresh_cubin), built for this GPU."""
    l2_flush_bytes: int
    """At least this many bytes are written before every timed call (raised to twice the
    device's L2 size when that is larger)."""
    warmup: int = 3
    warmup_seconds: float = 0.3
    min_runs: int = 30
    min_seconds: float = 0.5
    max_seconds: float = 60.0
    call_timeout_s: float = CALL_TIMEOUT_S
    """The deadline of each timed call of the kernel and the incumbent, and of each
    re-check (`gpu_workers.deadlines`): one still running then is a timeout."""


class CalibrateJob(msgspec.Struct, frozen=True, kw_only=True, tag="calibrate"):
    copy_bytes: int
    matmul_n: int
    dtypes: list[str]
    matmul_library: str
    """"torch" or "cupy": one the device probe found working with CUDA (the worker picks)."""
    repeats: int = 10


Job = VerifyJob | BenchJob | CalibrateJob


class JudgedCall(msgspec.Struct, frozen=True, kw_only=True):
    """A kernel call whose inputs came back as given (judged_in_file) and as it left them
    (judged_after_file), with its outputs (judged_out_file)."""

    slot: int
    call: int
    """Its index among the kernel's calls, warm-up first (fresh.judged_calls replays it)."""
    timed: bool
    """False for a warm-up call."""
    input_set: int
    """The pool set it ran on."""
    refresh: int
    """The refresh (counted over the run) that wrote its inputs: fresh.refresh_key."""


class BenchReply(msgspec.Struct, frozen=True, kw_only=True, tag="bench"):
    kernel_ns: list[int]
    kernel_warmup_ns: list[int]
    baseline_ns: list[int]
    incumbent_ns: list[int]
    input_sets: int
    rotated_bytes: int
    timed_seconds: float
    baseline: str
    """What the kernel was compared against, for a human (library, version, formula)."""
    l2_flush_bytes: int
    cache_policy: str
    secret_seed: int
    kernel_calls: int
    """The kernel's calls in timing, warm-up included (not the re-checks)."""
    judged: list[JudgedCall]
    rechecks: list[RecheckJob]
    """Done in this order: recheck_out_file(index, name) holds each one's outputs and
    recheck_after_file(index, name) its inputs as the call left them."""
    input_policy: str


class CalibrateReply(msgspec.Struct, frozen=True, kw_only=True, tag="calibrate"):
    device_name: str
    pci_bus_id: str
    sm_count: int
    l2_bytes: int
    copy_bytes: int
    """Bytes read plus bytes written by one timed device-to-device copy."""
    copy_seconds: float
    matmul_n: int
    matmul_seconds: dict[str, float]
    matmul_library: str


class FaultReply(msgspec.Struct, frozen=True, kw_only=True, tag="fault"):
    """The runner stopped early. A kernel fault (reason in KERNEL_FAULTS) rejects the
    kernel; a harness fault is the runner's own failure and must never reject one."""

    reason: str
    message: str
    harness: bool = False
    evidence: dict[str, str] = msgspec.field(default_factory=dict)


Reply = VerifyReply | BenchReply | CalibrateReply | FaultReply


def judged_in_file(slot: int, name: str) -> str:
    return f"judged_{slot}_in_{name}.npy"


def judged_out_file(slot: int, name: str) -> str:
    return f"judged_{slot}_out_{name}.npy"


def judged_after_file(slot: int, name: str) -> str:
    """An input of a judged call as the call left it."""
    return f"judged_{slot}_after_{name}.npy"


def recheck_out_file(index: int, name: str) -> str:
    return f"recheck_{index}_out_{name}.npy"


def recheck_after_file(index: int, name: str) -> str:
    return f"recheck_{index}_after_{name}.npy"


def bits_dtype(dtype: str) -> np.dtype[Any]:
    """The unsigned integer type with the element's width."""
    widths = {"fp32": np.uint32, "fp16": np.uint16, "bf16": np.uint16}
    if dtype not in widths:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(widths)}")
    return np.dtype(widths[dtype])


def element_dtype(dtype: str) -> np.dtype[Any]:
    if dtype == "fp32":
        return np.dtype(np.float32)
    if dtype == "fp16":
        return np.dtype(np.float16)
    if dtype == "bf16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    raise ValueError(f"unknown dtype {dtype!r}; known: bf16, fp16, fp32")


def as_bits(array: npt.NDArray[Any], dtype: str) -> npt.NDArray[Any]:
    """The raw bits of an array of `dtype` elements (a view, C-contiguous)."""
    bits = bits_dtype(dtype)
    contiguous = np.ascontiguousarray(array)
    if contiguous.dtype.itemsize != bits.itemsize:
        raise ValueError(
            f"an array of {contiguous.dtype} ({contiguous.dtype.itemsize} bytes) is not {dtype}"
        )
    return contiguous.view(bits)


def save_bits(path: Path | str, array: npt.NDArray[Any], dtype: str) -> None:
    np.save(path, as_bits(array, dtype))


def load_elements(path: Path | str, dtype: str) -> npt.NDArray[Any]:
    """An array saved by save_bits, as `dtype` elements."""
    bits = np.load(path)
    if bits.dtype != bits_dtype(dtype):
        raise ValueError(f"{path} holds {bits.dtype}, not the bits of {dtype}")
    return bits.view(element_dtype(dtype))
