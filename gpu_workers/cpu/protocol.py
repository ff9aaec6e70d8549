"""Messages between the worker and its sandboxed CPU runner (files in the sandbox dir).

The file names, RunRecord and VerifyReply are every runner's: gpu_workers.runner_files.
"""

from __future__ import annotations

import msgspec

from gpu_workers.runner_files import VerifyReply

POISON_BITS = (0x7FBADBAD, 0xFFC0FFEE)
"""Output poison per run: two different NaN payloads, so 'unwritten' is recognisable."""


class TrialJob(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    shape: dict[str, int]
    distribution: str
    seed: int
    arg_shapes: list[list[int]]
    dims: list[int]
    """Dimension values in signature order."""
    runs: int


class VerifyJob(msgspec.Struct, frozen=True, kw_only=True, tag="verify"):
    library: str
    arg_names: list[str]
    outputs: list[bool]
    trials: list[TrialJob]


class BenchJob(msgspec.Struct, frozen=True, kw_only=True, tag="bench"):
    library: str
    incumbent_library: str | None
    problem: str
    dtype: str
    shape: dict[str, int]
    seeds: list[int]
    recheck_seed: int
    rotate_bytes: int
    warmup: int = 3
    warmup_seconds: float = 0.3
    min_runs: int = 30
    min_seconds: float = 0.5
    max_seconds: float = 60.0


class CalibrateJob(msgspec.Struct, frozen=True, kw_only=True, tag="calibrate"):
    library: str
    copy_bytes: int
    sgemm_n: int
    fma_iterations: int


Job = VerifyJob | BenchJob | CalibrateJob


class BenchReply(msgspec.Struct, frozen=True, kw_only=True, tag="bench"):
    kernel_ns: list[int]
    kernel_warmup_ns: list[int]
    baseline_ns: list[int]
    incumbent_ns: list[int]
    input_sets: int
    rotated_bytes: int
    timed_seconds: float


class CalibrateReply(msgspec.Struct, frozen=True, kw_only=True, tag="calibrate"):
    copy_seconds: float
    copy_bytes: int
    numpy_copy_seconds: float
    sgemm_seconds: float
    sgemm_n: int
    fma_seconds: float
    fma_flops: float
    streaming_stores: bool


Reply = VerifyReply | BenchReply | CalibrateReply
