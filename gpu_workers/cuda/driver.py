"""The driver layer of the CUDA runner: the context, memory, module loading, launches,
events and the L2 flush, through pycuda and the driver API itself.

pycuda holds the context and does memory, copies and events; modules are loaded and
kernels launched through the driver API by ctypes (Launcher), because pycuda has no
cuFuncSetAttribute. Every driver call is checked (pycuda raises; the launcher checks each
CUresult). Whatever a kernel makes fail here raises KernelFault with the reason; the
runner (gpu_workers.cuda.runner) decides what is run, judged and written back.
"""

from __future__ import annotations

import ctypes
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gpu_workers.cuda import protocol as p
from gpu_workers.cuda.call_clock import DERIVED, CallClock
from kernels.cuda_launch import LaunchError, LaunchPlan, ResolvedLaunch, parse_launch_plan
from kernels.spec import Problem

DEFAULT_SHARED_LIMIT = 48 * 1024
"""Shared memory per block a kernel gets without opting in (static + dynamic)."""
CANARY = ((np.arange(p.SLACK_BYTES, dtype=np.uint32) * 37 + 11) % 251 + 3).astype(np.uint8)
"""Slack contents: no zero byte and no repeating short period, so neither a stray memset
nor a stray vector store can rewrite it unnoticed."""

Bits = npt.NDArray[Any]


class KernelFault(Exception):
    """The kernel (not the harness) failed; `reason` is one of protocol.KERNEL_FAULTS."""

    def __init__(self, reason: str, message: str, evidence: dict[str, str] | None = None):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.evidence = evidence or {}


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
        launch = packed.launch
        self.launch_function(
            packed.function,
            launch.grid,
            launch.block,
            launch.shared_bytes,
            packed.params,
            launch.kernel,
        )

    def launch_function(
        self,
        function: ctypes.c_void_p,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        params: Any,
        name: str,
    ) -> None:
        """cuLaunchKernel on the legacy default stream, `params` laid out as it reads them."""
        code = self.lib.cuLaunchKernel(function, *grid, *block, shared_bytes, None, params, None)
        self.check(code, f"cuLaunchKernel({name})")


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


class Timer:
    """CUDA events around one call on the default stream, after writing a buffer larger
    than L2 so no call finds its inputs cached by the call before. The flush also keeps
    the GPU busy while the host enqueues the call, so launch overhead is not timed unless
    the call itself makes the GPU wait for the host (as an eager chain of ops does)."""

    def __init__(
        self,
        gpu: Gpu,
        flush_bytes: int,
        call_timeout_s: float,
        clock: CallClock | None = None,
    ):
        self.gpu = gpu
        self.flush_bytes = flush_bytes
        self.call_timeout_s = call_timeout_s
        """The deadline of a kernel's (or the incumbent's) timed call."""
        self.harness_timeout_s = max(call_timeout_s, p.CALL_TIMEOUT_S)
        """What an `own` call (the baseline) may take: never less than a kernel's."""
        self.clock = clock
        """Where the worker sees when a bounded call began (`call_clock`)."""
        self.flush = gpu.alloc(flush_bytes, "L2 flush buffer")
        self.value = 0
        self.start: Any = gpu.cuda.Event()
        self.end: Any = gpu.cuda.Event()

    def gpu_call(
        self, call: Callable[[], None], what: str, *, kernel: bool, own: bool = False
    ) -> int:
        """Nanoseconds between the events around `call`. A fault or a call that does not
        finish in time is the kernel's when `kernel`, else the harness's. A call is
        bounded by the call deadline, stamped on the clock, unless it is the harness's
        `own` (the baseline), allowed `harness_timeout_s`."""
        cuda = self.gpu.cuda
        self.value = (self.value + 1) % 256
        limit = self.harness_timeout_s if own else self.call_timeout_s
        clock = None if own else self.clock
        try:
            cuda.memset_d8_async(int(self.flush), self.value, self.flush_bytes)
            self.start.record()
            call()
            self.end.record()
            if clock is not None:
                clock.started()
            deadline = time.monotonic() + limit
            while not self.end.query():  # spins, as a synchronize would, but with a deadline
                if time.monotonic() > deadline:
                    raise KernelFault(
                        "timeout",
                        f"{what} was still running after {limit:g} s"
                        if own
                        else f"{what} took longer than its {limit:.3g} s deadline ({DERIVED})",
                        {"call_limit_seconds": f"{limit:.3g}"},
                    )
            if clock is not None:
                clock.ended()
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


def event_seconds(gpu: Gpu, call: Callable[[], object], repeats: int) -> float:
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
