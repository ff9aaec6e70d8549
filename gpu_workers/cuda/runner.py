"""The sandboxed side of the CUDA back end: loads a cubin and runs, times or calibrates.

Runs only as `python -m gpu_workers.sandbox gpu_workers.cuda.runner` inside the sandbox
dir, so the CUDA context (the device's primary context, shared with torch and cupy) lives
and dies with this process: a kernel that faults leaves the context unusable, and only
this process goes with it. It reads `request.json`, writes arrays as .npy files of raw
bits and `result.json`; before each kernel launch of a verification it writes
`progress.txt`, so a fault can be pinned to a trial and a launch.

The driver layer (context, memory, module loading, launches, events, the L2 flush) is
gpu_workers.cuda.driver; this module decides what runs on which inputs and what comes
back. Timing draws fresh inputs before every timed call and brings back the inputs and
outputs of calls chosen at random from the job's secret seed (gpu_workers.cuda.fresh).
A kernel's fault ends the process with a FaultReply saying why (crashed, launch_failed,
timeout, memory_limit, bad_launch); anything else that goes wrong is a harness fault,
reported as such.

Every device array and scratch buffer has canary bytes on both sides (`Guarded`,
`protocol.SLACK_BYTES`); outputs are poisoned with a NaN of the dtype (a different
payload per run); every launch is synchronised and checked, and one that does not end
within `launch_timeout_s` (verification) or `call_timeout_s` (timing: the call deadline
of `gpu_workers.deadlines`) is a timeout. Each timed call's start is stamped on the call
clock (`call_clock`), so that the worker kills a runner stuck past the deadline.
Timing uses CUDA events on the default stream with the L2 flushed before every call
(`l2_flush_bytes`, at least twice the L2), the kernel, the baseline and the incumbent
interleaved (`gpu_workers.interleave`) over input sets in turn, each with outputs of its
own poisoned again before every call.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import msgspec
import numpy as np

from gpu_workers import runner_files as files
from gpu_workers.cuda import baselines, fresh
from gpu_workers.cuda import protocol as p
from gpu_workers.cuda.call_clock import CallClock
from gpu_workers.cuda.driver import (
    Bits,
    Gpu,
    Guarded,
    KernelFault,
    Loaded,
    Timer,
    allow_shared,
    call_plan,
    event_seconds,
    load_kernel,
    pack,
    resolve,
)
from gpu_workers.interleave import interleave
from kernels.cuda_launch import ResolvedLaunch
from kernels.spec import Arrays, Problem

FAULT_EXIT = 3
HARNESS_EXIT = 4


def _progress(text: str) -> None:
    Path(files.PROGRESS_FILE).write_text(text)


def _elements(problem: Problem, shape: dict[str, int]) -> dict[str, int]:
    return {a.name: math.prod(a.shape(shape)) for a in problem.args}


# Verification ---------------------------------------------------------------------------


def verify(gpu: Gpu, job: p.VerifyJob) -> files.VerifyReply:
    from kernels.loading import load_problem

    problem = load_problem(job.problem)
    _progress("loading")
    kernel = load_kernel(gpu, job.kernel, problem, "the kernel")
    bits = p.bits_dtype(job.dtype)
    plans = {
        t.index: resolve(kernel, {d: int(t.shape[d]) for d in problem.dims}) for t in job.trials
    }
    allow_shared(gpu, kernel, (launch for launches, _ in plans.values() for launch in launches))
    records: list[files.RunRecord] = []
    for trial in job.trials:
        dims = {d: int(trial.shape[d]) for d in problem.dims}
        launches, sizes = plans[trial.index]
        counts = _elements(problem, trial.shape)
        inputs = {a.name: np.load(files.input_file(trial.index, a.name)) for a in problem.inputs}
        for arg in problem.inputs:
            if inputs[arg.name].dtype != bits or inputs[arg.name].size != counts[arg.name]:
                raise ValueError(
                    f"input file of {arg.name} does not hold {counts[arg.name]} {bits}"
                )
        for run in range(trial.runs):
            poison = p.POISON_BITS[job.dtype][run % 2]
            arrays = {
                a.name: Guarded(gpu, counts[a.name] * bits.itemsize, a.name) for a in problem.args
            }
            buffers = {name: Guarded(gpu, n, name, kernel_fault=True) for name, n in sizes.items()}
            for arg in problem.args:
                if arg.output:
                    gpu.fill(arrays[arg.name].ptr, poison, counts[arg.name], bits.itemsize)
                else:
                    gpu.upload(arrays[arg.name].ptr, inputs[arg.name])
            pointers = {name: g.ptr for name, g in (*arrays.items(), *buffers.items())}

            def where(
                index: int, launch: ResolvedLaunch, trial: p.TrialJob = trial, run: int = run
            ) -> str:
                text = (
                    f"trial {trial.index} run {run} launch {index} ({launch.kernel} "
                    f"grid={launch.grid} block={launch.block} smem={launch.shared_bytes}): "
                    f"shape {trial.shape}, {trial.distribution} inputs, seed {trial.seed}"
                )
                _progress(text)
                return text

            gpu.synchronize("before the first launch")  # uploads and fills are done
            started = time.perf_counter()
            call_plan(
                gpu,
                kernel,
                pack(kernel, launches, pointers, dims),
                {name: (g.ptr, g.nbytes) for name, g in buffers.items()},
                wait_s=job.launch_timeout_s,
                progress=where,
            )
            seconds = time.perf_counter() - started
            damaged = [d for g in (*arrays.values(), *buffers.values()) for d in g.damaged()]
            for arg in problem.args:
                target = files.out_file if arg.output else files.after_file
                host = gpu.download(arrays[arg.name].ptr, arg.shape(trial.shape), bits)
                np.save(target(trial.index, run, arg.name), host)
            records.append(
                files.RunRecord(trial=trial.index, run=run, damaged_slack=damaged, seconds=seconds)
            )
            for g in (*arrays.values(), *buffers.values()):
                g.free()
    _progress(p.DONE)
    return files.VerifyReply(runs=records)


# Timing ----------------------------------------------------------------------------------


class Contender:
    """A loaded kernel ready to run on any input set: its own outputs and scratch, the
    shared device inputs. A call zeroes its scratch first (the plan's contract), inside the
    timed region: that work is part of the kernel. `poison` refills the outputs of a set
    before each timed call, outside it, so no call finds the answer of an earlier one."""

    def __init__(
        self,
        gpu: Gpu,
        kernel: Loaded,
        problem: Problem,
        dims: dict[str, int],
        inputs: list[dict[str, int]],
        output_bytes: dict[str, int],
        poison_bits: int,
        itemsize: int,
    ):
        self.gpu, self.kernel, self.dims = gpu, kernel, dims
        self.output_bytes, self.poison_bits, self.itemsize = output_bytes, poison_bits, itemsize
        self.launches, sizes = resolve(kernel, dims)
        allow_shared(gpu, kernel, self.launches)
        self.keep: list[Any] = []
        self.scratch: dict[str, tuple[int, int]] = {}
        for name, nbytes in sizes.items():
            allocation = gpu.alloc(nbytes, f"{kernel.label} buffer {name}", kernel_fault=True)
            self.keep.append(allocation)
            self.scratch[name] = (int(allocation), nbytes)
        self.outputs: list[dict[str, int]] = []
        for _ in inputs:
            outputs = {}
            for name, nbytes in output_bytes.items():
                allocation = gpu.alloc(nbytes, f"{kernel.label} output {name}")
                self.keep.append(allocation)
                outputs[name] = int(allocation)
            self.outputs.append(outputs)
            self.poison(len(self.outputs) - 1)
        self.pointers = [
            {**ins, **outs, **{n: ptr for n, (ptr, _) in self.scratch.items()}}
            for ins, outs in zip(inputs, self.outputs, strict=True)
        ]
        self.packed = [pack(kernel, self.launches, ptrs, dims) for ptrs in self.pointers]

    def poison(self, index: int) -> None:
        for name, pointer in self.outputs[index].items():
            count = self.output_bytes[name] // self.itemsize
            self.gpu.fill(pointer, self.poison_bits, count, self.itemsize)

    def __call__(self, index: int) -> None:
        call_plan(self.gpu, self.kernel, self.packed[index], self.scratch)


@contextlib.contextmanager
def _not_the_kernels(what: str) -> Iterator[None]:
    """Loading or preparing the incumbent or the baseline: a fault there is the harness's
    (as it is when they are timed), except memory the kernel's own buffers may have taken."""
    try:
        yield
    except KernelFault as fault:
        if fault.reason == "memory_limit":
            raise
        raise RuntimeError(f"{what} failed: {fault.reason}: {fault.message}") from fault


def _baseline(
    gpu: Gpu,
    job: p.BenchJob,
    problem: Problem,
    host_sets: list[Arrays],
    make_contender: Callable[[Loaded], Contender],
) -> baselines.Baseline:
    if job.baseline == "torch":
        return baselines.torch_baseline(problem, job.dtype, host_sets)
    if job.baseline == "cupy":
        return baselines.cupy_baseline(problem, job.dtype, host_sets)
    if job.baseline == "naive_cuda":
        if job.baseline_kernel is None:
            raise ValueError("a naive_cuda baseline needs its kernel")
        loaded = load_kernel(gpu, job.baseline_kernel, problem, "the naive CUDA baseline")
        return _KernelBaseline(baselines.NAIVE_CUDA, make_contender(loaded))
    if job.baseline == "numpy_host":
        return baselines.host_baseline(problem, host_sets)
    raise ValueError(f"unknown baseline {job.baseline!r}; known: {baselines.CHOICES}")


@dataclass
class _KernelBaseline:
    name: str
    contender: Contender
    host_timed: bool = False

    def __call__(self, index: int) -> None:
        self.contender(index)


class Refresher:
    """Fresh inputs before a timed call: the harness's refresh kernel (fresh.py) overwrites
    every input array of a pool set with rows drawn from a reservoir of the problem's own
    input sets, by keys from the secret seed; then waits, so that a fault here is the
    harness's and the call that follows starts on finished inputs. The reservoir stays on
    the device for the whole run."""

    def __init__(
        self,
        gpu: Gpu,
        cubin: str,
        problem: Problem,
        shape: dict[str, int],
        itemsize: int,
        reservoir: list[dict[str, Bits]],
        secret_seed: int,
    ):
        self.gpu, self.secret_seed = gpu, secret_seed
        launcher = gpu.launcher
        self.function = launcher.function(
            launcher.load(Path(cubin).read_bytes()), fresh.REFRESH_KERNEL
        )
        self.sets = len(reservoir)
        if self.sets < 1:
            raise ValueError("the reservoir needs at least one input set")
        self.keep: list[Any] = []
        self.arrays: list[tuple[str, fresh.RowLayout, int]] = []
        for arg in problem.inputs:
            layout = fresh.row_layout(problem, arg, shape, itemsize)
            nbytes = layout.units * fresh.UNIT_BYTES
            allocation = gpu.alloc(self.sets * nbytes, f"the input reservoir of {arg.name}")
            self.keep.append(allocation)
            for index, arrays in enumerate(reservoir):
                gpu.upload(int(allocation) + index * nbytes, arrays[arg.name])
            self.arrays.append((arg.name, layout, int(allocation)))
        self.count = 0

    def __call__(self, pointers: dict[str, int]) -> int:
        """Refresh the inputs at `pointers`; the refresh's number (fresh.refresh_key)."""
        number = self.count
        self.count += 1
        for index, (name, layout, reservoir) in enumerate(self.arrays):
            if layout.units == 0:
                continue
            key = fresh.refresh_key(self.secret_seed, number, index)
            values = [
                ctypes.c_uint64(v)
                for v in (pointers[name], reservoir, layout.rows, layout.row_units, self.sets, key)
            ]
            params = (ctypes.c_void_p * len(values))(
                *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values]
            )
            self.gpu.launcher.launch_function(
                self.function,
                fresh.refresh_grid(layout),
                (fresh.REFRESH_BLOCK, 1, 1),
                0,
                params,
                fresh.REFRESH_KERNEL,
            )
        self.gpu.synchronize("refreshing the inputs")
        return number


@dataclass
class _Judged:
    call: int
    input_set: int
    refresh: int
    inputs: dict[str, Bits]
    outputs: dict[str, Bits]
    inputs_after: dict[str, Bits]


def bench(gpu: Gpu, job: p.BenchJob) -> p.BenchReply:
    from kernels.loading import load_problem

    problem = load_problem(job.problem)
    dims = {d: int(job.shape[d]) for d in problem.dims}
    bits = p.bits_dtype(job.dtype)
    counts = _elements(problem, job.shape)
    output_bytes = {a.name: counts[a.name] * bits.itemsize for a in problem.outputs}
    timed_poison, recheck_poison = p.POISON_BITS[job.dtype]
    _progress("loading")
    kernel = load_kernel(gpu, job.kernel, problem, "the kernel")
    incumbent = None
    if job.incumbent is not None:
        with _not_the_kernels("the incumbent"):
            incumbent = load_kernel(gpu, job.incumbent, problem, "the incumbent")
    distinct = [problem.generate(job.shape, "normal", seed, job.dtype) for seed in job.seeds]
    reservoir = [
        {a.name: p.as_bits(s[a.name], job.dtype) for a in problem.inputs} for s in distinct
    ]
    keep: list[Any] = []
    inputs: list[dict[str, int]] = []
    for arrays in reservoir:
        device = {}
        for arg in problem.inputs:
            allocation = gpu.alloc(counts[arg.name] * bits.itemsize, f"input {arg.name}")
            keep.append(allocation)
            gpu.upload(int(allocation), arrays[arg.name])
            device[arg.name] = int(allocation)
        inputs.append(device)
    refresh = Refresher(
        gpu, job.refresh_cubin, problem, job.shape, bits.itemsize, reservoir, job.secret_seed
    )

    def contender(loaded: Loaded) -> Contender:
        return Contender(
            gpu, loaded, problem, dims, inputs, output_bytes, timed_poison, bits.itemsize
        )

    mine = contender(kernel)
    with _not_the_kernels("the incumbent"):
        theirs = contender(incumbent) if incumbent is not None else None
    _progress(p.PREPARING_BASELINE)
    with _not_the_kernels("the baseline"):
        baseline = _baseline(gpu, job, problem, distinct, contender)
    flush_bytes = max(job.l2_flush_bytes, 2 * gpu.l2_bytes)
    clock = CallClock()
    timer = Timer(gpu, flush_bytes, job.call_timeout_s, clock)
    gpu.synchronize("before timing")
    n_sets = len(distinct)
    choice = fresh.JudgeChoice(job.secret_seed, job.judged_calls)
    judged: dict[int, _Judged] = {}

    def read(pointers: dict[str, int], args: tuple[Any, ...]) -> dict[str, Bits]:
        return {a.name: gpu.download(pointers[a.name], a.shape(job.shape), bits) for a in args}

    def call_kernel(i: int) -> int:
        """Fresh inputs, the judged call's inputs read back, poisoned outputs, then the
        timed call; all but the call itself outside the events."""
        call = choice.calls
        number = refresh(inputs[i])
        slot = choice.offer(call)
        given = read(inputs[i], problem.inputs) if slot is not None else {}
        mine.poison(i)
        ns = timer.gpu_call(lambda: mine(i), f"timed call {call} on input set {i}", kernel=True)
        if slot is not None:
            wrote = read(mine.outputs[i], problem.outputs)
            after = read(inputs[i], problem.inputs)
            judged[slot] = _Judged(call, i, number, given, wrote, after)
        return ns

    def call_incumbent(i: int) -> int:
        assert theirs is not None
        refresh(inputs[i])
        theirs.poison(i)
        return timer.gpu_call(lambda: theirs(i), "the incumbent", kernel=False)

    def call_baseline(i: int) -> int:
        if baseline.host_timed:
            return timer.host_call(lambda: baseline(i))
        if isinstance(baseline, _KernelBaseline):
            baseline.contender.poison(i)
        return timer.gpu_call(lambda: baseline(i), "the baseline", kernel=False, own=True)

    samples = interleave(
        call_kernel,
        call_baseline,
        call_incumbent if theirs is not None else None,
        n_sets,
        warmup=job.warmup,
        warmup_seconds=job.warmup_seconds,
        min_runs=job.min_runs,
        min_seconds=job.min_seconds,
        max_seconds=job.max_seconds,
        progress=_progress,
    )
    _progress(p.SAVING_OUTPUTS)
    warm_up_calls = len(samples.kernel_warmup_ns)
    records = []
    for slot in sorted(judged):
        held = judged[slot]
        for name, array in held.inputs.items():
            np.save(p.judged_in_file(slot, name), array)
        for name, array in held.outputs.items():
            np.save(p.judged_out_file(slot, name), array)
        for name, array in held.inputs_after.items():
            np.save(p.judged_after_file(slot, name), array)
        records.append(
            p.JudgedCall(
                slot=slot,
                call=held.call,
                timed=held.call >= warm_up_calls,
                input_set=held.input_set,
                refresh=held.refresh,
            )
        )
    judged.clear()
    pointers = dict(mine.pointers[0])
    for arg in problem.args:
        allocation = gpu.alloc(counts[arg.name] * bits.itemsize, f"re-check {arg.name}")
        keep.append(allocation)
        pointers[arg.name] = int(allocation)
    packed = pack(kernel, mine.launches, pointers, dims)
    for index, recheck in enumerate(job.rechecks):
        _progress(f"re-check {index}: {recheck.distribution} inputs, seed {recheck.seed}")
        given = problem.generate(job.shape, recheck.distribution, recheck.seed, job.dtype)
        for arg in problem.args:
            if arg.output:
                gpu.fill(pointers[arg.name], recheck_poison, counts[arg.name], bits.itemsize)
            else:
                gpu.upload(pointers[arg.name], p.as_bits(given[arg.name], job.dtype))
        gpu.synchronize("before the re-check")
        call_plan(gpu, kernel, packed, mine.scratch)
        clock.started()
        gpu.wait(job.call_timeout_s, f"re-check {index} on fresh {recheck.distribution} inputs")
        clock.ended()
        for arg in problem.args:
            host = gpu.download(pointers[arg.name], arg.shape(job.shape), bits)
            target = p.recheck_out_file if arg.output else p.recheck_after_file
            np.save(target(index, arg.name), host)
    _progress(p.DONE)
    set_bytes = sum(counts.values()) * bits.itemsize
    return p.BenchReply(
        kernel_ns=samples.kernel_ns,
        kernel_warmup_ns=samples.kernel_warmup_ns,
        baseline_ns=samples.baseline_ns,
        incumbent_ns=samples.incumbent_ns,
        input_sets=n_sets,
        rotated_bytes=n_sets * set_bytes,
        timed_seconds=samples.timed_seconds,
        baseline=baseline.name,
        l2_flush_bytes=flush_bytes,
        cache_policy=(
            f"L2 ({gpu.l2_bytes >> 20} MiB) flushed before every timed call by writing "
            f"{flush_bytes >> 20} MiB; {n_sets} input sets in turn; CUDA events "
            "on the default stream"
        ),
        secret_seed=job.secret_seed,
        kernel_calls=choice.calls,
        judged=records,
        rechecks=list(job.rechecks),
        input_policy=(
            "inputs of the kernel and the incumbent overwritten on the device before every "
            f"timed call, outside the events, with rows drawn from {len(reservoir)} generated "
            f"sets by keys from the secret seed; {len(records)} of {choice.calls} kernel calls "
            "judged, chosen by the secret seed"
        ),
    )


# Calibration ------------------------------------------------------------------------------


def _matmul_seconds_of(
    gpu: Gpu, matmul: Callable[..., object], a: Any, b: Any, c: Any, repeats: int
) -> float:
    return event_seconds(gpu, lambda: matmul(a, b, out=c), repeats)


def _matmul_seconds(gpu: Gpu, job: p.CalibrateJob) -> tuple[str, dict[str, float]]:
    """The best time of a library matmul per dtype, by the library the worker chose (one
    the device probe found working with CUDA)."""
    n = job.matmul_n
    seconds: dict[str, float] = {}
    if job.matmul_library == "torch":
        import torch  # type: ignore[import-not-found, unused-ignore]

        matmul = torch.backends.cuda.matmul
        if hasattr(matmul, "fp32_precision"):
            matmul.fp32_precision = "ieee"
        else:
            matmul.allow_tf32 = False
        types = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        for dtype in job.dtypes:
            generator = torch.Generator(device="cuda").manual_seed(0)
            a = torch.randn((n, n), device="cuda", dtype=types[dtype], generator=generator)
            b = torch.randn((n, n), device="cuda", dtype=types[dtype], generator=generator)
            c = torch.empty_like(a)
            seconds[dtype] = _matmul_seconds_of(gpu, torch.matmul, a, b, c, job.repeats)
            del a, b, c
        return f"torch {torch.__version__} matmul (cuBLAS), fp32 with TF32 off", seconds
    if job.matmul_library != "cupy":
        raise ValueError(f"unknown matmul library {job.matmul_library!r}; known: torch, cupy")
    import cupy  # type: ignore[import-not-found, unused-ignore]

    for dtype in job.dtypes:
        if dtype == "bf16":
            continue  # cupy has no bfloat16
        kind = {"fp32": cupy.float32, "fp16": cupy.float16}[dtype]
        rng = cupy.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype=cupy.float32).astype(kind)
        b = rng.standard_normal((n, n), dtype=cupy.float32).astype(kind)
        c = cupy.empty_like(a)
        seconds[dtype] = _matmul_seconds_of(gpu, cupy.matmul, a, b, c, job.repeats)
    return f"cupy {cupy.__version__} matmul (cuBLAS; CUPY_TF32 unset: fp32 without TF32)", seconds


def calibrate(gpu: Gpu, job: p.CalibrateJob) -> p.CalibrateReply:
    cuda = gpu.cuda
    n = job.copy_bytes - job.copy_bytes % 4
    src = gpu.alloc(n, "copy source")
    dst = gpu.alloc(n, "copy destination")
    cuda.memset_d32(int(src), 0x3F800000, n // 4)
    cuda.memset_d32(int(dst), 0, n // 4)
    copy_s = event_seconds(gpu, lambda: cuda.memcpy_dtod_async(int(dst), int(src), n), job.repeats)
    gpu.synchronize("the calibration copy")
    for offset in (0, n // 2 - n // 2 % 4, n - 4096):
        sample = gpu.download(int(dst) + offset, (1024,), np.dtype(np.uint32))
        if not np.all(sample == 0x3F800000):
            raise RuntimeError(f"the device-to-device copy left wrong bytes at offset {offset}")
    src.free()
    dst.free()
    library, matmul = _matmul_seconds(gpu, job)
    attr = cuda.device_attribute
    return p.CalibrateReply(
        device_name=gpu.device.name(),
        pci_bus_id=gpu.device.pci_bus_id(),
        sm_count=int(gpu.device.get_attribute(attr.MULTIPROCESSOR_COUNT)),
        l2_bytes=gpu.l2_bytes,
        copy_bytes=2 * n,
        copy_seconds=copy_s,
        matmul_n=job.matmul_n,
        matmul_seconds=matmul,
        matmul_library=library,
    )


# Entry point --------------------------------------------------------------------------------


def _finish(reply: p.Reply, status: int) -> NoReturn:
    """Write the reply and leave at once: after a fault the context is unusable, and
    library teardown at interpreter exit (pycuda, torch, cupy) has nothing left to do."""
    Path(files.RESULT_FILE).write_bytes(msgspec.json.encode(reply))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(args: list[str]) -> None:
    reply: p.Reply
    try:
        job = msgspec.json.decode(Path(files.REQUEST_FILE).read_bytes(), type=p.Job)
        gpu = Gpu()
        if isinstance(job, p.VerifyJob):
            reply = verify(gpu, job)
        elif isinstance(job, p.BenchJob):
            reply = bench(gpu, job)
        else:
            reply = calibrate(gpu, job)
        gpu.close()
    except KernelFault as fault:
        _finish(
            p.FaultReply(reason=fault.reason, message=fault.message, evidence=fault.evidence),
            FAULT_EXIT,
        )
    except Exception as exc:
        text = traceback.format_exc()
        print(text, file=sys.stderr)
        _finish(
            p.FaultReply(
                reason="harness_error",
                message=f"{type(exc).__name__}: {exc}",
                harness=True,
                evidence={"traceback": text[-8000:]},
            ),
            HARNESS_EXIT,
        )
    _finish(reply, 0)
