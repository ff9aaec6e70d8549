"""The CUDA runner's timing path on a fake device, on any host.

No GPU runs here: a stand-in for pycuda's driver module keeps "device memory" in a numpy
array, and a stand-in launcher runs the kernels it is asked to launch (the harness's
refresh kernel, replayed by fresh.refresh_on_host, and Python versions of the planted
kernels) after decoding their cuLaunchKernel parameters. Everything else is the runner's
own code: the pool, the refresh before every call, the choice of judged calls, the reads
back, the files and the reply, then the back end's reading of them and the benchmarker's
judging. What this cannot show is that the real device does the same: the GPU tests in
test_cuda_fresh.py do.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from gpu_workers.benchmarking import judge_calls
from gpu_workers.cuda import fresh, runner
from gpu_workers.cuda import protocol as p
from gpu_workers.cuda import timing as cuda_timing
from gpu_workers.cuda.call_clock import call_started
from gpu_workers.cuda.driver import Gpu, KernelFault
from gpu_workers.results import SandboxReport
from gpu_workers.sandbox import SandboxOutcome
from kernels.builtin import GELU

BASE = 0x7F00_0000_0000
MEMORY = 64 << 20
SHAPE = {"n": 4096}
SOURCE = """#include <stdint.h>
// kf-launch: kf_gelu(x, y, n) grid=(cdiv(n, 256)) block=(256)
extern "C" __global__ void kf_gelu(const float *x, float *y, int64_t n) { }
"""


class FakeError(Exception):
    pass


class FakeAllocation:
    def __init__(self, address: int) -> None:
        self.address = address

    def __int__(self) -> int:
        return self.address

    def free(self) -> None:
        pass


class FakeEvent:
    def record(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def time_since(self, other: FakeEvent) -> float:
        return 0.01  # milliseconds


class FakeCuda:
    """The parts of pycuda.driver the runner uses, over one numpy array of "device memory"."""

    Error = FakeError
    MemoryError = FakeError
    Event = FakeEvent

    class Context:
        @staticmethod
        def synchronize() -> None:
            pass

    def __init__(self) -> None:
        self.memory = np.zeros(MEMORY, dtype=np.uint8)
        self.next = BASE

    def at(self, ptr: int, nbytes: int) -> np.ndarray:
        offset = ptr - BASE
        assert offset >= 0 and offset + nbytes <= MEMORY, f"wild address {ptr:#x}"
        return self.memory[offset : offset + nbytes]

    def mem_alloc(self, nbytes: int) -> FakeAllocation:
        address = self.next
        self.next += -(-nbytes // 256) * 256
        assert self.next - BASE <= MEMORY, "fake device memory exhausted"
        return FakeAllocation(address)

    def memcpy_htod(self, ptr: int, host: np.ndarray) -> None:
        self.at(ptr, host.nbytes)[...] = host.reshape(-1).view(np.uint8)

    def memcpy_dtoh(self, host: np.ndarray, ptr: int) -> None:
        host.reshape(-1).view(np.uint8)[...] = self.at(ptr, host.nbytes)

    def memset_d32(self, ptr: int, bits: int, count: int) -> None:
        self.at(ptr, 4 * count).view(np.uint32)[...] = bits

    def memset_d16(self, ptr: int, bits: int, count: int) -> None:
        self.at(ptr, 2 * count).view(np.uint16)[...] = bits

    def memset_d8_async(self, ptr: int, value: int, nbytes: int) -> None:
        self.at(ptr, nbytes)[...] = value


Kernel = Callable[[FakeCuda, list[int]], None]


def _gelu(x: np.ndarray) -> np.ndarray:
    v = x.astype(np.float64)
    return (0.5 * v * (1.0 + np.tanh(0.7978845608028654 * (v + 0.044715 * v**3)))).astype(
        np.float32
    )


def gelu(cuda: FakeCuda, args: list[int]) -> None:
    x, y, n = args
    cuda.at(y, 4 * n).view(np.float32)[...] = _gelu(cuda.at(x, 4 * n).view(np.float32))


def memoizes_by_pointer() -> Kernel:
    remembered: dict[int, np.ndarray] = {}

    def kernel(cuda: FakeCuda, args: list[int]) -> None:
        x, y, n = args
        if x not in remembered:
            remembered[x] = _gelu(cuda.at(x, 4 * n).view(np.float32))
        cuda.at(y, 4 * n).view(np.float32)[...] = remembered[x]

    return kernel


def wrong_on_odd_calls() -> Kernel:
    calls = 0

    def kernel(cuda: FakeCuda, args: list[int]) -> None:
        nonlocal calls
        x, y, n = args
        if calls % 2:
            cuda.at(y, 4 * n)[...] = cuda.at(x, 4 * n)
        else:
            gelu(cuda, args)
        calls += 1

    return kernel


def refresh(cuda: FakeCuda, args: list[int]) -> None:
    """kf_refresh, by its host replica."""
    dst, reservoir, rows, row_units, sets, key = args
    layout = fresh.RowLayout(rows=rows, row_units=row_units)
    nbytes = layout.units * fresh.UNIT_BYTES
    source = cuda.at(reservoir, sets * nbytes).view(np.uint16).reshape(sets, -1)
    cuda.at(dst, nbytes).view(np.uint16)[...] = fresh.refresh_on_host(source, key, layout)


class FakeLauncher:
    SHARED_SIZE_BYTES = 1
    MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

    def __init__(self, cuda: FakeCuda, kernel: Kernel) -> None:
        self.cuda = cuda
        self.kernels: dict[str, Kernel] = {"kf_gelu": kernel, fresh.REFRESH_KERNEL: refresh}
        self.launches: list[str] = []

    def load(self, image: bytes) -> bytes:
        return image

    def function(self, module: bytes, name: str) -> str:
        return name

    def get_attribute(self, function: str, attribute: int) -> int:
        return 0

    def set_attribute(self, function: str, attribute: int, value: int) -> None:
        raise AssertionError("no kernel here asks for more shared memory")

    def launch(self, packed: Any) -> None:
        launch = packed.launch
        self.launch_function(
            packed.function, launch.grid, launch.block, launch.shared_bytes, packed.params, "k"
        )

    def launch_function(
        self,
        function: str,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_bytes: int,
        params: Any,
        name: str,
    ) -> None:
        """Decode the parameters as cuLaunchKernel would (an array of pointers to 8-byte
        values) and run the kernel."""
        count = len(params)
        values = [ctypes.c_uint64.from_address(params[i]).value for i in range(count)]
        if function == fresh.REFRESH_KERNEL:
            assert len(values) == 6 and grid[0] >= 1 and block == (fresh.REFRESH_BLOCK, 1, 1)
        self.launches.append(function)
        self.kernels[function](self.cuda, values)


def fake_gpu(kernel: Kernel) -> Gpu:
    gpu = Gpu.__new__(Gpu)  # the real Gpu's methods over the fake driver module
    cuda = FakeCuda()
    gpu.cuda = cuda
    gpu.launcher = FakeLauncher(cuda, kernel)  # type: ignore[assignment]
    gpu.l2_bytes = 1 << 20
    return gpu


def _job(tmp_path: Path, judged_calls: int = 6) -> p.BenchJob:
    (tmp_path / "k.cu").write_text(SOURCE)
    (tmp_path / "k.cubin").write_bytes(b"cubin")
    (tmp_path / "refresh.cubin").write_bytes(b"refresh")
    return p.BenchJob(
        kernel=p.KernelRef(cubin=str(tmp_path / "k.cubin"), source=str(tmp_path / "k.cu")),
        incumbent=None,
        baseline="numpy_host",
        baseline_kernel=None,
        problem="gelu",
        dtype="fp32",
        shape=SHAPE,
        seeds=[21, 22],
        rechecks=[p.RecheckJob(distribution=d, seed=s) for d, s in _rechecks()],
        secret_seed=4242,
        judged_calls=judged_calls,
        refresh_cubin=str(tmp_path / "refresh.cubin"),
        l2_flush_bytes=0,
        warmup=2,
        warmup_seconds=0.0,
        min_runs=24,
        min_seconds=0.0,
    )


def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: Kernel, *, judged_calls: int = 6
) -> tuple[p.BenchReply, cuda_timing.CudaTiming, FakeLauncher]:
    job = _job(tmp_path, judged_calls)
    gpu = fake_gpu(kernel)
    monkeypatch.chdir(tmp_path)
    reply = runner.bench(gpu, job)
    outcome = SandboxOutcome(
        returncode=0,
        signal_name=None,
        timed_out=False,
        cpu_limit_hit=False,
        wall_seconds=5.0,
        cpu_seconds=1.0,
        other_cpu_seconds=None,
        stdout="",
        stderr="",
        report=SandboxReport(
            network_isolated=False,
            network_note="fake",
            cpu_seconds_limit=1,
            address_space_limit_bytes=-1,
            wall_seconds_limit=1.0,
        ),
    )
    poison = p.POISON_BITS["fp32"]
    timing = cuda_timing.read_timing(GELU, "fp32", tmp_path, reply, outcome, poison)
    assert isinstance(gpu.launcher, FakeLauncher)
    return reply, timing, gpu.launcher


def _rechecks() -> list[tuple[str, int]]:
    return cuda_timing.default_rechecks(GELU, 23)


def test_a_right_kernel_passes_with_fresh_inputs_before_every_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reply, timing, launcher = _run(tmp_path, monkeypatch, gelu)
    calls = len(reply.kernel_warmup_ns) + len(reply.kernel_ns)
    assert reply.kernel_calls == calls and len(reply.kernel_ns) >= 24
    assert reply.secret_seed == 4242
    # Before every kernel call, one refresh launch per input; then the re-checks.
    timed = [name for name in launcher.launches]
    assert timed.count(fresh.REFRESH_KERNEL) == calls
    assert timed.count("kf_gelu") == calls + len(_rechecks())
    assert [j.call for j in sorted(reply.judged, key=lambda j: j.slot)] == fresh.judged_calls(
        4242, 6, calls
    )
    inputs = {c.inputs["x"].tobytes() for c in timing.judged}
    assert len(inputs) == len(timing.judged) == 6  # every judged call saw inputs of its own
    reservoir = np.stack(
        [p.as_bits(GELU.generate(SHAPE, "normal", s, "fp32")["x"], "fp32") for s in (21, 22)]
    )
    layout = fresh.row_layout(GELU, GELU.args[0], SHAPE, 4)
    for call in timing.judged:
        key = fresh.refresh_key(4242, call.record.refresh, 0)
        expected = fresh.refresh_on_host(reservoir, key, layout)
        assert np.array_equal(p.as_bits(call.inputs["x"], "fp32").view(np.uint16), expected)
    run = cuda_timing.timing_run(GELU, "fp32", SHAPE, timing)
    assert run.rejection is None
    assert judge_calls(GELU, "fp32", run.judged) is None
    assert run.rechecked == list(GELU.distributions)
    assert run.judged_calls == sorted(c.record.call for c in timing.judged)


def test_a_kernel_that_memoizes_by_pointer_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, timing, _ = _run(tmp_path, monkeypatch, memoizes_by_pointer())
    run = cuda_timing.timing_run(GELU, "fp32", SHAPE, timing)
    rejection = judge_calls(GELU, "fp32", run.judged)
    assert rejection is not None and rejection.stage == "recheck"
    assert "chosen at random" in rejection.evidence["when"]


def test_a_kernel_wrong_on_odd_calls_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, timing, _ = _run(tmp_path, monkeypatch, wrong_on_odd_calls(), judged_calls=12)
    run = cuda_timing.timing_run(GELU, "fp32", SHAPE, timing)
    assert judge_calls(GELU, "fp32", run.judged) is not None
    tolerance = GELU.tolerances["fp32"]
    from gpu_workers.verification import check_outputs

    for call in timing.judged:
        wrong = check_outputs(GELU, tolerance, call.inputs, call.outputs, timing.poison_bits[0])
        assert (wrong[0] is not None) == (call.record.call % 2 == 1)


def test_without_fresh_inputs_the_memoizer_would_pass_its_timed_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the same run with the refresh made a no-op. Its timed calls pass (so
    the fresh inputs are what catches it); the re-checks, all on one pointer, still do."""

    def unchanged(self: runner.Refresher, pointers: dict[str, int]) -> int:
        self.count += 1
        return self.count - 1

    monkeypatch.setattr(runner.Refresher, "__call__", unchanged)
    _, timing, _ = _run(tmp_path, monkeypatch, memoizes_by_pointer())
    run = cuda_timing.timing_run(GELU, "fp32", SHAPE, timing)
    timed = len(timing.judged)
    assert judge_calls(GELU, "fp32", run.judged[:timed]) is None
    assert judge_calls(GELU, "fp32", run.judged[timed:]) is not None


class NeverEndingEvent(FakeEvent):
    """An event recorded after a kernel that never ends (`never_ends`) never completes."""

    stuck = False

    def query(self) -> bool:
        return not NeverEndingEvent.stuck


def never_ends(cuda: FakeCuda, args: list[int]) -> None:
    NeverEndingEvent.stuck = True


def test_a_timed_call_past_its_deadline_ends_the_run_as_a_timeout_with_the_call_stamped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's own check of the call deadline (`BenchJob.call_timeout_s`, from
    `gpu_workers.deadlines`); the call stays stamped on the call clock, where the worker's
    watch would kill a runner that could not end itself."""
    monkeypatch.setattr(FakeCuda, "Event", NeverEndingEvent)
    monkeypatch.setattr(NeverEndingEvent, "stuck", False)
    job = msgspec.structs.replace(_job(tmp_path), call_timeout_s=0.25)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KernelFault) as fault:
        runner.bench(fake_gpu(never_ends), job)
    assert fault.value.reason == "timeout"
    assert "timed call 0 on input set 0 took longer than its 0.25 s deadline" in str(fault.value)
    assert fault.value.evidence["call_limit_seconds"] == "0.25"
    assert call_started(tmp_path) is not None
