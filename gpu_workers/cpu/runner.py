"""The sandboxed side of the CPU back end: loads a kernel and runs, times or calibrates.

Runs only as `python -m gpu_workers.sandbox gpu_workers.cpu.runner` inside the sandbox
dir. It reads `request.json`, writes arrays as .npy files and `result.json`. Before each
kernel call it writes `progress.txt`, so a crash can be pinned to a trial.
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
from gpu_workers.cpu.guarded import GuardedArray, aligned_empty
from gpu_workers.interleave import Call, interleave

FloatArray = npt.NDArray[np.float32]
Kernel = Callable[..., None]


def _progress(text: str) -> None:
    Path(files.PROGRESS_FILE).write_text(text)


def _load(library: str, n_arrays: int, n_dims: int, symbol: str = "kernel") -> Kernel:
    fn = getattr(ctypes.CDLL(library), symbol)
    fn.argtypes = [ctypes.c_void_p] * n_arrays + [ctypes.c_int64] * n_dims
    fn.restype = None
    return fn


def _poison(array: FloatArray, bits: int) -> None:
    array.view(np.uint32)[...] = np.uint32(bits)


def verify(job: p.VerifyJob) -> files.VerifyReply:
    n_dims = len(job.trials[0].dims) if job.trials else 0
    fn = _load(job.library, len(job.arg_names), n_dims)
    records: list[files.RunRecord] = []
    for trial in job.trials:
        inputs = {
            name: np.load(files.input_file(trial.index, name))
            for name, out in zip(job.arg_names, job.outputs, strict=True)
            if not out
        }
        for run in range(trial.runs):
            buffers = [GuardedArray(tuple(shape)) for shape in trial.arg_shapes]
            try:
                for buf, name, out in zip(buffers, job.arg_names, job.outputs, strict=True):
                    if out:
                        _poison(buf.array, p.POISON_BITS[run % len(p.POISON_BITS)])
                    else:
                        buf.array[...] = inputs[name]
                _progress(
                    f"trial {trial.index} run {run}: shape {trial.shape}, "
                    f"{trial.distribution} inputs, seed {trial.seed}"
                )
                started = time.perf_counter()
                fn(*(buf.address for buf in buffers), *trial.dims)
                seconds = time.perf_counter() - started
                damaged = [
                    name
                    for buf, name in zip(buffers, job.arg_names, strict=True)
                    if not buf.slack_intact()
                ]
                for buf, name, out in zip(buffers, job.arg_names, job.outputs, strict=True):
                    target = files.out_file if out else files.after_file
                    np.save(target(trial.index, run, name), buf.array)
                records.append(
                    files.RunRecord(
                        trial=trial.index, run=run, damaged_slack=damaged, seconds=seconds
                    )
                )
            finally:
                for buf in buffers:
                    buf.release()
    _progress("done")
    return files.VerifyReply(runs=records)


def bench(job: p.BenchJob) -> p.BenchReply:
    from kernels.loading import load_problem

    problem = load_problem(job.problem)
    names = [a.name for a in problem.args]
    outputs = [a.name for a in problem.outputs]
    dims = [int(job.shape[d]) for d in problem.dims]
    kernel = _load(job.library, len(names), len(dims))
    incumbent = (
        _load(job.incumbent_library, len(names), len(dims)) if job.incumbent_library else None
    )
    distinct = [problem.generate(job.shape, "normal", seed, job.dtype) for seed in job.seeds]
    set_bytes = problem.nbytes(job.shape, job.dtype)
    n_sets = max(2, len(distinct), math.ceil(job.rotate_bytes / set_bytes))
    sets: list[dict[str, FloatArray]] = []
    for i in range(n_sets):
        arrays: dict[str, FloatArray] = {}
        for arg in problem.args:
            arrays[arg.name] = aligned_empty(arg.shape(job.shape))
            if arg.output:
                _poison(arrays[arg.name], p.POISON_BITS[0])
            else:
                arrays[arg.name][...] = distinct[i % len(distinct)][arg.name]
        sets.append(arrays)
    input_views = [{a.name: s[a.name] for a in problem.inputs} for s in sets]

    def poisoned_outputs() -> dict[str, FloatArray]:
        arrays = {a.name: aligned_empty(a.shape(job.shape)) for a in problem.outputs}
        for array in arrays.values():
            _poison(array, p.POISON_BITS[0])
        return arrays

    # The incumbent writes into outputs of its own, so the kernel never finds its answer.
    incumbent_sets = [{**views, **poisoned_outputs()} for views in input_views]
    timed_outputs = [poisoned_outputs() for _ in distinct]

    def contender(fn: Kernel, arrays: list[dict[str, FloatArray]], save: bool) -> Call:
        pointers = [[a[n].ctypes.data for n in names] for a in arrays]

        def call(i: int) -> int:
            started = time.perf_counter_ns()
            fn(*pointers[i], *dims)
            elapsed = time.perf_counter_ns() - started
            # Every call starts from poisoned outputs, so no call can find an earlier
            # answer. Poisoned after the call, not before it: the outputs stay as cold as
            # the rotation left them.
            for name in outputs:
                if save:
                    np.copyto(timed_outputs[i % len(distinct)][name], arrays[i][name])
                _poison(arrays[i][name], p.POISON_BITS[0])
            return elapsed

        return call

    def call_baseline(i: int) -> int:
        started = time.perf_counter_ns()
        problem.baseline(input_views[i])
        return time.perf_counter_ns() - started

    samples = interleave(
        contender(kernel, sets, save=True),
        call_baseline,
        contender(incumbent, incumbent_sets, save=False) if incumbent is not None else None,
        n_sets,
        warmup=job.warmup,
        warmup_seconds=job.warmup_seconds,
        min_runs=job.min_runs,
        min_seconds=job.min_seconds,
        max_seconds=job.max_seconds,
        progress=_progress,
    )
    _progress("saving timed outputs")
    for seed_index, saved in enumerate(timed_outputs):
        for name in outputs:
            np.save(files.timed_out_file(seed_index, name), saved[name])
    sets.clear()
    incumbent_sets.clear()
    _progress("re-check with fresh inputs")
    fresh = problem.generate(job.shape, "uniform", job.recheck_seed, job.dtype)
    arrays = {}
    for arg in problem.args:
        arrays[arg.name] = aligned_empty(arg.shape(job.shape))
        if arg.output:
            _poison(arrays[arg.name], p.POISON_BITS[1])
        else:
            arrays[arg.name][...] = fresh[arg.name]
    kernel(*(arrays[n].ctypes.data for n in names), *dims)
    for name in outputs:
        np.save(files.recheck_file(name), arrays[name])
    _progress("done")
    return p.BenchReply(
        kernel_ns=samples.kernel_ns,
        kernel_warmup_ns=samples.kernel_warmup_ns,
        baseline_ns=samples.baseline_ns,
        incumbent_ns=samples.incumbent_ns,
        input_sets=n_sets,
        rotated_bytes=n_sets * set_bytes,
        timed_seconds=samples.timed_seconds,
    )


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
    src, dst = aligned_empty((n,)), aligned_empty((n,))
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
        reply = verify(job)
    elif isinstance(job, p.BenchJob):
        reply = bench(job)
    else:
        reply = calibrate(job)
    Path(files.RESULT_FILE).write_bytes(msgspec.json.encode(reply))
