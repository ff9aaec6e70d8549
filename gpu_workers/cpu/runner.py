"""The CPU driver: runs in the sandbox as `python -m gpu_workers.sandbox gpu_workers.cpu.runner`.

Trusted: it never loads a kernel. A kernel runs only in a kernel host the driver starts
(kernel_process.py), which shares with it nothing but the arena holding that kernel's
inputs and outputs; the driver stamps each call from outside. It reads `request.json`
and writes `result.json`: verification (verify_run.py), timing (timing_run.py), or the
host's calibration, whose kernels are ours and are loaded here.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt

from gpu_workers import runner_files as files
from gpu_workers.cpu import protocol as p

FloatArray = npt.NDArray[np.float32]


def _aligned_empty(count: int, align: int = 64) -> FloatArray:
    raw = np.empty(count * 4 + align, dtype=np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset : offset + count * 4].view(np.float32)


def calibrate(job: p.CalibrateJob) -> p.CalibrateReply:
    lib = ctypes.CDLL(job.library)
    copy = lib.kf_stream_copy
    copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    copy.restype = None
    fma = lib.kf_fma_peak
    fma.argtypes = [ctypes.c_int64]
    fma.restype = ctypes.c_double
    streaming = ctypes.c_int.in_dll(lib, "kf_streaming_stores").value != 0
    n = job.copy_bytes // 4
    src, dst = _aligned_empty(n), _aligned_empty(n)
    rng = np.random.default_rng(0)
    src[...] = rng.standard_normal(n, dtype=np.float32)  # random: no page can be deduplicated
    dst[...] = rng.standard_normal(n, dtype=np.float32)
    warm_until = time.perf_counter() + 1.0  # fresh memory on some hosts is slow at first
    while time.perf_counter() < warm_until:
        copy(src.ctypes.data, dst.ctypes.data, n)
    copy_s = _best(lambda: copy(src.ctypes.data, dst.ctypes.data, n), repeats=15)
    if not np.array_equal(src[:: max(1, n // 4096)], dst[:: max(1, n // 4096)]):
        raise RuntimeError("the calibration copy kernel produced a wrong copy")
    numpy_s = _best(lambda: np.copyto(dst, src))
    a = np.random.default_rng(0).standard_normal((job.sgemm_n, job.sgemm_n), dtype=np.float32)
    sgemm_s = _best(lambda: a @ a)
    fma(job.fma_iterations // 10)
    flops = 0.0

    def run_fma() -> None:
        nonlocal flops
        flops = fma(job.fma_iterations)

    fma_s = _best(run_fma)
    return p.CalibrateReply(
        copy_seconds=copy_s,
        copy_bytes=2 * n * 4,
        numpy_copy_seconds=numpy_s,
        sgemm_seconds=sgemm_s,
        sgemm_n=job.sgemm_n,
        fma_seconds=fma_s,
        fma_flops=flops,
        streaming_stores=streaming,
    )


def _best(action: Callable[[], object], repeats: int = 7) -> float:
    action()
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


def main(args: list[str]) -> None:
    job = msgspec.json.decode(Path(files.REQUEST_FILE).read_bytes(), type=p.Job)
    reply: p.Reply
    if isinstance(job, p.VerifyJob):
        from gpu_workers.cpu.verify_run import verify

        reply = verify(job)
    elif isinstance(job, p.FinalJob):
        from gpu_workers.cpu.final_run import final_run

        reply = final_run(job)
    elif isinstance(job, p.BenchJob):
        from gpu_workers.cpu.timing_run import bench  # imports the problem library

        reply = bench(job)
    else:
        reply = calibrate(job)
    Path(files.RESULT_FILE).write_bytes(msgspec.json.encode(reply))
