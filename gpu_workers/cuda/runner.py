"""The sandboxed side of the CUDA back end: loads a cubin and runs, times or calibrates.

Runs only as `python -m gpu_workers.sandbox gpu_workers.cuda.runner` inside the sandbox
dir, so the CUDA context (the device's primary context, shared with torch and cupy) lives
and dies with this process: a kernel that faults leaves the context unusable, and only
this process goes with it. It reads `request.json`, writes arrays as .npy files of raw
bits and `result.json`; before each kernel launch of a verification it writes
`progress.txt`, so a fault can be pinned to a trial and a launch.

pycuda holds the context and does memory, copies and events; modules are loaded and
kernels launched through the driver API by ctypes (Launcher). Every driver call is checked
(pycuda raises; the launcher checks each CUresult). A kernel's fault ends the process with
a FaultReply saying why (crashed, launch_failed, timeout, memory_limit, bad_launch);
anything else that goes wrong is a harness fault, reported as such.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import msgspec
import numpy as np
import numpy.typing as npt

from gpu_workers import runner_files as files
from gpu_workers.cuda import baselines
from gpu_workers.cuda import protocol as p
from gpu_workers.interleave import interleave
from kernels.cuda_launch import LaunchError, LaunchPlan, ResolvedLaunch, parse_launch_plan
from kernels.spec import Arrays, Problem

DEFAULT_SHARED_LIMIT = 48 * 1024
"""Shared memory per block a kernel gets without opting in (static + dynamic)."""
CANARY = ((np.arange(p.SLACK_BYTES, dtype=np.uint32) * 37 + 11) % 251 + 3).astype(np.uint8)
"""Slack contents: no zero byte and no repeating short period, so neither a stray memset
nor a stray vector store can rewrite it unnoticed."""
FAULT_EXIT = 3
HARNESS_EXIT = 4

Bits = npt.NDArray[Any]


class KernelFault(Exception):
    """The kernel (not the harness) failed; `reason` is one of protocol.KERNEL_FAULTS."""

    def __init__(self, reason: str, message: str, evidence: dict[str, str] | None = None):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.evidence = evidence or {}


def _progress(text: str) -> None:
    Path(files.PROGRESS_FILE).write_text(text)


def _elements(problem: Problem, shape: dict[str, int]) -> dict[str, int]:
    return {a.name: math.prod(a.shape(shape)) for a in problem.args}


class Gpu:
    """The primary context of device 0, current on this thread, and the driver calls made."""

    def __init__(self) -> None:
        import pycuda.driver as cuda  # type: ignore[import-not-found, unused-ignore]

        cuda.init()
        self.cuda: Any = cuda
        self.device: Any = cuda.Device(0)
        self.context: Any = self.device.retain_primary_context()
        self.context.push()
        self.launcher = Launcher()
        self.l2_bytes = int(self.device.get_attribute(cuda.device_attribute.L2_CACHE_SIZE))

    def close(self) -> None:
        try:
            self.context.pop()
            self.context.detach()
        except self.cuda.Error as exc:  # after every result is written and synchronized
            print(f"warning: releasing the CUDA context failed: {exc}", file=sys.stderr)

    def alloc(self, nbytes: int, what: str, *, kernel_fault: bool = False) -> Any:
        try:
            return self.cuda.mem_alloc(max(1, nbytes))
        except self.cuda.MemoryError as exc:
            if kernel_fault:
                raise KernelFault(
                    "memory_limit", f"{what}: {nbytes} bytes of device memory refused ({exc})"
                ) from exc
            raise

    def upload(self, ptr: int, bits: Bits) -> None:
        if bits.nbytes:
            self.cuda.memcpy_htod(ptr, np.ascontiguousarray(bits))

    def download(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Bits:
        host = np.empty(shape, dtype=dtype)
        if host.nbytes:
            self.cuda.memcpy_dtoh(host, ptr)
        return host

    def fill(self, ptr: int, bits: int, count: int, itemsize: int) -> None:
        """Set `count` elements of `itemsize` bytes to `bits` (the output poison)."""
        if count == 0:
            return
        if itemsize == 4:
            self.cuda.memset_d32(ptr, bits, count)
        elif itemsize == 2:
            self.cuda.memset_d16(ptr, bits, count)
        else:
            raise ValueError(f"no poison fill for {itemsize}-byte elements")

    def synchronize(self, what: str) -> None:
        """Wait for the harness's own work (uploads, fills, copies): called only where
        every kernel launched before was already waited for by `wait` or the Timer, so
        an error here is the harness's, never a kernel's."""
        try:
            self.cuda.Context.synchronize()
        except self.cuda.Error as exc:
            raise RuntimeError(f"{what}: {exc}") from exc

    def wait(self, timeout_s: float, what: str) -> None:
        """Wait for the kernel launched last on the default stream, with a deadline: a
        kernel still running then is a timeout, a CUDA error on the way is a crash."""
        deadline = time.monotonic() + timeout_s
        pause = 1e-5
        try:
            done = self.cuda.Event()
            done.record()
            while not done.query():
                if time.monotonic() > deadline:
                    raise KernelFault("timeout", f"{what} was still running after {timeout_s:g} s")
                time.sleep(pause)
                pause = min(2 * pause, 0.01)
            self.cuda.Context.synchronize()
        except self.cuda.Error as exc:
            raise KernelFault("crashed", f"{what}: {exc}", {"cuda_error": str(exc)}) from exc


class Guarded:
    """A device array with SLACK_BYTES of canary before and after it."""

    def __init__(self, gpu: Gpu, nbytes: int, name: str, *, kernel_fault: bool = False):
        self.gpu, self.nbytes, self.name = gpu, nbytes, name
        self.allocation = gpu.alloc(
            nbytes + 2 * p.SLACK_BYTES, f"{name} (with its canaries)", kernel_fault=kernel_fault
        )
        self.base = int(self.allocation)
        self.ptr = self.base + p.SLACK_BYTES  # still 256-byte aligned, as cuMemAlloc's are
        gpu.upload(self.base, CANARY)
        gpu.upload(self.ptr + nbytes, CANARY)

    def damaged(self) -> list[str]:
        found = []
        if not np.array_equal(
            self.gpu.download(self.ptr + self.nbytes, CANARY.shape, CANARY.dtype), CANARY
        ):
            found.append(self.name)
        if not np.array_equal(self.gpu.download(self.base, CANARY.shape, CANARY.dtype), CANARY):
            found.append(f"{self.name} (before its start)")
        return found

    def free(self) -> None:
        self.allocation.free()


class DriverError(Exception):
    """A driver API call made through ctypes failed; the message names the call and error."""


class Launcher:
    """Module loading and kernel launches through the CUDA driver API itself (ctypes), in
    the context pycuda made current. pycuda has no cuFuncSetAttribute, and a kernel needs
    it for more than 48 KiB of dynamic shared memory (any large Hopper tile)."""

    SHARED_SIZE_BYTES = 1  # CUfunction_attribute values
    MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        pointer, integer, unsigned = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
        signatures: dict[str, list[Any]] = {
            "cuModuleLoadData": [ctypes.POINTER(pointer), pointer],
            "cuModuleGetFunction": [ctypes.POINTER(pointer), pointer, ctypes.c_char_p],
            "cuFuncGetAttribute": [ctypes.POINTER(integer), integer, pointer],
            "cuFuncSetAttribute": [pointer, integer, integer],
            "cuLaunchKernel": [pointer, *[unsigned] * 7, pointer, pointer, pointer],
            "cuGetErrorName": [integer, ctypes.POINTER(ctypes.c_char_p)],
            "cuGetErrorString": [integer, ctypes.POINTER(ctypes.c_char_p)],
        }
        for name, argtypes in signatures.items():
            function = getattr(lib, name)
            function.argtypes = argtypes
            function.restype = integer
        self.lib = lib
        self.images: list[Any] = []  # module images stay alive with the process

    def check(self, code: int, call: str) -> None:
        if code == 0:
            return
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(name))
        self.lib.cuGetErrorString(code, ctypes.byref(text))
        label = (name.value or b"CUDA error %d" % code).decode()
        raise DriverError(f"{call} failed: {label}: {(text.value or b'').decode()}")

    def load(self, image: bytes) -> ctypes.c_void_p:
        buffer = ctypes.create_string_buffer(image, len(image))
        self.images.append(buffer)
        module = ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), buffer), "cuModuleLoadData")
        return module

    def function(self, module: ctypes.c_void_p, name: str) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        code = self.lib.cuModuleGetFunction(ctypes.byref(handle), module, name.encode())
        self.check(code, f"cuModuleGetFunction({name})")
        return handle

    def get_attribute(self, function: ctypes.c_void_p, attribute: int) -> int:
        value = ctypes.c_int()
        code = self.lib.cuFuncGetAttribute(ctypes.byref(value), attribute, function)
        self.check(code, "cuFuncGetAttribute")
        return value.value

    def set_attribute(self, function: ctypes.c_void_p, attribute: int, value: int) -> None:
        self.check(self.lib.cuFuncSetAttribute(function, attribute, value), "cuFuncSetAttribute")

    def launch(self, packed: Packed) -> None:
        """One launch on the legacy default stream (the stream pycuda, torch and cupy use)."""
        grid, block = packed.launch.grid, packed.launch.block
        code = self.lib.cuLaunchKernel(
            packed.function,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            packed.launch.shared_bytes,
            None,
            packed.params,
            None,
        )
        self.check(code, f"cuLaunchKernel({packed.launch.kernel})")


@dataclass
class Packed:
    """One launch with its argument values laid out as cuLaunchKernel takes them."""

    launch: ResolvedLaunch
    function: ctypes.c_void_p
    values: list[Any]
    params: Any


@dataclass
class Loaded:
    """A cubin loaded into the context, with the launch plan of its source."""

    label: str
    plan: LaunchPlan
    functions: dict[str, ctypes.c_void_p]
    dims: frozenset[str]


def load_kernel(gpu: Gpu, ref: p.KernelRef, problem: Problem, label: str) -> Loaded:
    try:
        plan = parse_launch_plan(Path(ref.source).read_text(), problem)
    except LaunchError as exc:
        raise KernelFault("bad_launch", f"{label}: {exc}") from exc
    try:
        module = gpu.launcher.load(Path(ref.cubin).read_bytes())
    except DriverError as exc:
        raise KernelFault("launch_failed", f"{label}: the cubin does not load: {exc}") from exc
    functions: dict[str, ctypes.c_void_p] = {}
    for name in plan.kernels:
        try:
            functions[name] = gpu.launcher.function(module, name)
        except DriverError as exc:
            raise KernelFault(
                "launch_failed",
                f'{label}: the cubin has no kernel {name!r} (declare it extern "C" __global__): '
                f"{exc}",
            ) from exc
    kinds: dict[str, str] = {}
    for launch in plan.launches:
        kind = "".join("q" if a in problem.dims else "P" for a in launch.args)
        if kinds.setdefault(launch.kernel, kind) != kind:
            raise KernelFault(
                "bad_launch",
                f"{label}: {launch.kernel} is launched with different argument kinds "
                f"({kinds[launch.kernel]} and {kind}; P = pointer, q = int64)",
            )
    return Loaded(label, plan, functions, frozenset(problem.dims))


def resolve(
    kernel: Loaded, dims: dict[str, int]
) -> tuple[tuple[ResolvedLaunch, ...], dict[str, int]]:
    """The launches and scratch sizes at one shape."""
    try:
        return kernel.plan.resolve(dims), kernel.plan.buffer_bytes(dims)
    except LaunchError as exc:
        raise KernelFault("bad_launch", f"{kernel.label} at {dims}: {exc}") from exc


def allow_shared(gpu: Gpu, kernel: Loaded, launches: Iterable[ResolvedLaunch]) -> None:
    """Opt each kernel in to the dynamic shared memory its largest launch asks for, where
    static plus dynamic exceeds what a block gets without opting in."""
    launcher = gpu.launcher
    wanted: dict[str, int] = {}
    for launch in launches:
        wanted[launch.kernel] = max(wanted.get(launch.kernel, 0), launch.shared_bytes)
    for name, dynamic in wanted.items():
        function = kernel.functions[name]
        try:
            static = launcher.get_attribute(function, launcher.SHARED_SIZE_BYTES)
            if static + dynamic > DEFAULT_SHARED_LIMIT:
                launcher.set_attribute(function, launcher.MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic)
        except DriverError as exc:
            raise KernelFault(
                "launch_failed",
                f"{kernel.label}: {name} asks for {dynamic} bytes of dynamic shared memory: {exc}",
            ) from exc


def pack(
    kernel: Loaded,
    launches: tuple[ResolvedLaunch, ...],
    pointers: dict[str, int],
    dims: dict[str, int],
) -> list[Packed]:
    """Every launch's arguments: a device pointer per array or buffer, an int64 per dim."""
    packed = []
    for launch in launches:
        values: list[Any] = [
            ctypes.c_int64(dims[a]) if a in kernel.dims else ctypes.c_uint64(pointers[a])
            for a in launch.args
        ]
        params = (ctypes.c_void_p * max(1, len(values)))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values]
        )
        packed.append(Packed(launch, kernel.functions[launch.kernel], values, params))
    return packed


def call_plan(
    gpu: Gpu,
    kernel: Loaded,
    packed: list[Packed],
    scratch: dict[str, tuple[int, int]],
    *,
    wait_s: float | None = None,
    progress: Callable[[int, ResolvedLaunch], str] | None = None,
) -> None:
    """Zero the scratch buffers, then launch the plan in order on the default stream.
    With `wait_s`, wait for each launch (verification: faults are pinned to a launch)."""
    for ptr, nbytes in scratch.values():
        if nbytes:
            gpu.cuda.memset_d8_async(ptr, 0, nbytes)
    for index, one in enumerate(packed):
        launch = one.launch
        where = progress(index, launch) if progress else f"{kernel.label} launch {index}"
        try:
            gpu.launcher.launch(one)
        except DriverError as exc:
            raise KernelFault(
                "launch_failed",
                f"{where}: launching {launch.kernel} grid={launch.grid} block={launch.block} "
                f"smem={launch.shared_bytes}: {exc}",
                {"cuda_error": str(exc)},
            ) from exc
        if wait_s is not None:
            gpu.wait(wait_s, where)


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


class Timer:
    """CUDA events around one call on the default stream, after writing a buffer larger
    than L2 so no call finds its inputs cached by the call before. The flush also keeps
    the GPU busy while the host enqueues the call, so launch overhead is not timed unless
    the call itself makes the GPU wait for the host (as an eager chain of ops does)."""

    def __init__(self, gpu: Gpu, flush_bytes: int, call_timeout_s: float):
        self.gpu = gpu
        self.flush_bytes = flush_bytes
        self.call_timeout_s = call_timeout_s
        self.flush = gpu.alloc(flush_bytes, "L2 flush buffer")
        self.value = 0
        self.start: Any = gpu.cuda.Event()
        self.end: Any = gpu.cuda.Event()

    def gpu_call(self, call: Callable[[], None], what: str, *, kernel: bool) -> int:
        """Nanoseconds between the events around `call`. A fault or a call that does not
        finish in time is the kernel's when `kernel`, else the harness's."""
        cuda = self.gpu.cuda
        self.value = (self.value + 1) % 256
        try:
            cuda.memset_d8_async(int(self.flush), self.value, self.flush_bytes)
            self.start.record()
            call()
            self.end.record()
            deadline = time.monotonic() + self.call_timeout_s
            while not self.end.query():  # spins, as a synchronize would, but with a deadline
                if time.monotonic() > deadline:
                    raise KernelFault(
                        "timeout", f"{what} was still running after {self.call_timeout_s:g} s"
                    )
        except cuda.Error as exc:
            if not kernel:
                raise
            raise KernelFault("crashed", f"{what}: {exc}", {"cuda_error": str(exc)}) from exc
        except KernelFault as fault:
            if kernel:
                raise
            raise RuntimeError(f"{what} failed: {fault.reason}: {fault.message}") from fault
        return round(self.end.time_since(self.start) * 1e6)

    @staticmethod
    def host_call(call: Callable[[], None]) -> int:
        started = time.perf_counter_ns()
        call()
        return time.perf_counter_ns() - started


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
    keep: list[Any] = []
    inputs: list[dict[str, int]] = []
    for arrays in distinct:
        device = {}
        for arg in problem.inputs:
            allocation = gpu.alloc(counts[arg.name] * bits.itemsize, f"input {arg.name}")
            keep.append(allocation)
            gpu.upload(int(allocation), p.as_bits(arrays[arg.name], job.dtype))
            device[arg.name] = int(allocation)
        inputs.append(device)

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
    timer = Timer(gpu, flush_bytes, job.call_timeout_s)
    gpu.synchronize("before timing")
    n_sets = len(distinct)

    def call_kernel(i: int) -> int:
        mine.poison(i)
        return timer.gpu_call(lambda: mine(i), f"timed call on input set {i}", kernel=True)

    def call_incumbent(i: int) -> int:
        assert theirs is not None
        theirs.poison(i)
        return timer.gpu_call(lambda: theirs(i), "the incumbent", kernel=False)

    def call_baseline(i: int) -> int:
        if baseline.host_timed:
            return timer.host_call(lambda: baseline(i))
        if isinstance(baseline, _KernelBaseline):
            baseline.contender.poison(i)
        return timer.gpu_call(lambda: baseline(i), "the baseline", kernel=False)

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
    for index in range(n_sets):
        for arg in problem.outputs:
            host = gpu.download(mine.outputs[index][arg.name], arg.shape(job.shape), bits)
            np.save(files.timed_out_file(index, arg.name), host)
    _progress("re-check with fresh inputs")
    fresh = problem.generate(job.shape, "uniform", job.recheck_seed, job.dtype)
    pointers = dict(mine.pointers[0])
    for arg in problem.args:
        allocation = gpu.alloc(counts[arg.name] * bits.itemsize, f"re-check {arg.name}")
        keep.append(allocation)
        pointers[arg.name] = int(allocation)
        if arg.output:
            gpu.fill(int(allocation), recheck_poison, counts[arg.name], bits.itemsize)
        else:
            gpu.upload(int(allocation), p.as_bits(fresh[arg.name], job.dtype))
    gpu.synchronize("before the re-check")
    call_plan(gpu, kernel, pack(kernel, mine.launches, pointers, dims), mine.scratch)
    gpu.wait(job.call_timeout_s, "the re-check call on fresh inputs")
    for arg in problem.outputs:
        host = gpu.download(pointers[arg.name], arg.shape(job.shape), bits)
        np.save(files.recheck_file(arg.name), host)
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
            f"{flush_bytes >> 20} MiB; {n_sets} distinct input sets in turn; CUDA events "
            "on the default stream"
        ),
    )


# Calibration ------------------------------------------------------------------------------


def _event_seconds(gpu: Gpu, call: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` calls, by CUDA events, after two untimed ones."""
    start, end = gpu.cuda.Event(), gpu.cuda.Event()
    for _ in range(2):
        call()
    gpu.synchronize("calibration warm-up")
    best = math.inf
    for _ in range(repeats):
        start.record()
        call()
        end.record()
        end.synchronize()
        best = min(best, end.time_since(start) / 1e3)
    return best


def _matmul_seconds_of(
    gpu: Gpu, matmul: Callable[..., object], a: Any, b: Any, c: Any, repeats: int
) -> float:
    return _event_seconds(gpu, lambda: matmul(a, b, out=c), repeats)


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
    copy_s = _event_seconds(gpu, lambda: cuda.memcpy_dtod_async(int(dst), int(src), n), job.repeats)
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
