"""The call deadline on the CUDA back end (issue 35, item 1), on any host: the worker kills
a runner stuck in a timed call past its deadline and the kernel is rejected as `timeout`
at the benchmark stage, the shape named. A real child process stands in for the runner
(`tests/stuck_cuda_runner.py`); the runner's own check of the deadline is tested on the
fake device (`test_cuda_fake_device.py`) and on a GPU (`test_cuda_runtime.py`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpu_workers.cuda import backend as cuda_backend
from gpu_workers.cuda import protocol as p
from gpu_workers.cuda.backend import CudaBackend, run_timing
from gpu_workers.cuda.call_clock import CallClock, call_started
from gpu_workers.cuda.nvcc import CudaBuild
from gpu_workers.cuda.timing import CudaTiming
from gpu_workers.deadlines import at_shape
from gpu_workers.protocols import TimingRequest
from gpu_workers.sandbox import Limits
from kernels.builtin import GELU
from kernels.spec import Problem

STAND_IN = "tests.stuck_cuda_runner"
SHAPE = {"n": 1 << 22}
LIMITS = Limits(cpu_seconds=60, address_space_bytes=-1, wall_seconds=120.0)


def _job(tmp_path: Path, call_timeout_s: float, judged_calls: int = 4) -> p.BenchJob:
    return p.BenchJob(
        kernel=p.KernelRef(cubin=str(tmp_path / "k.cubin"), source=str(tmp_path / "k.cu")),
        incumbent=None,
        baseline="numpy_host",
        baseline_kernel=None,
        problem="gelu",
        dtype="fp32",
        shape=SHAPE,
        seeds=[1, 2],
        rechecks=[],
        secret_seed=7,
        judged_calls=judged_calls,
        refresh_cubin=str(tmp_path / "refresh.cubin"),
        l2_flush_bytes=0,
        call_timeout_s=call_timeout_s,
    )


def _stand_ins_alive() -> list[str]:
    """This process's stand-in runners still alive (the sandbox names its worker's pid:
    another test's, running beside this one, is not ours)."""
    ours = f"gpu_workers.sandbox {os.getpid()} "
    alive = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if STAND_IN in text and ours in text:
            alive.append(text)
    return alive


def test_the_call_clock_says_when_the_call_in_progress_began(tmp_path: Path) -> None:
    assert call_started(tmp_path) is None  # no clock yet
    clock = CallClock(tmp_path / "call_clock.bin")
    assert call_started(tmp_path) is None
    clock.started()
    assert call_started(tmp_path) is not None
    clock.ended()
    assert call_started(tmp_path) is None


def test_a_runner_stuck_in_a_call_past_its_deadline_is_killed_and_the_kernel_timed_out(
    tmp_path: Path,
) -> None:
    timing = run_timing(GELU, _job(tmp_path, 0.5), LIMITS, runner=STAND_IN, grace_s=0.5)
    rejection = timing.rejection
    assert rejection is not None and timing.reply is None
    assert (rejection.stage, rejection.reason) == ("benchmark", "timeout")
    assert "0.5 s deadline" in rejection.message and "runner was killed" in rejection.message
    assert rejection.evidence["progress"] == "timing"
    named = at_shape(rejection, SHAPE)  # as the benchmark reports it
    assert "at the timed shape n=4194304" in named.message
    assert _stand_ins_alive() == []


def test_a_runner_between_calls_is_left_to_the_wall_clock(tmp_path: Path) -> None:
    """The control: the same stand-in with its call ended is not killed by the deadline
    watch, however long it runs; the sandbox's wall clock stops it."""
    short = Limits(cpu_seconds=60, address_space_bytes=-1, wall_seconds=3.0)
    timing = run_timing(
        GELU, _job(tmp_path, 0.5, judged_calls=0), short, runner=STAND_IN, grace_s=0.5
    )
    rejection = timing.rejection
    assert rejection is not None
    assert (rejection.stage, rejection.reason) == ("benchmark", "timeout")
    assert "wall-clock limit" in rejection.message and "deadline" not in rejection.message
    assert _stand_ins_alive() == []


def test_the_back_end_gives_the_runner_the_request_s_call_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`CudaBackend.time` with a request's deadline, on this host: the device probe, the
    baseline's choice and the refresh kernel (which need a GPU and nvcc) are stood in
    for, and the stand-in runner is run in the runner's place; the rest is the back
    end's own path to the benchmarker's TimingRun."""
    monkeypatch.setattr(cuda_backend, "require_gpu", lambda: None)
    monkeypatch.setattr(cuda_backend, "cuda_libraries", lambda: frozenset())
    monkeypatch.setattr(CudaBackend, "_refresh_cubin", lambda self, arch: tmp_path / "r.cubin")
    jobs: list[p.BenchJob] = []

    def stand_in(
        problem: Problem, job: p.BenchJob, limits: Limits, watch: Callable[[], None] | None
    ) -> CudaTiming:
        jobs.append(job)
        return run_timing(problem, job, limits, watch, runner=STAND_IN, grace_s=0.5)

    monkeypatch.setattr(cuda_backend, "run_timing", stand_in)
    build = CudaBuild(
        cubin=str(tmp_path / "k.cubin"),
        source=str(tmp_path / "k.cu"),
        ptx=str(tmp_path / "k.ptx"),
        arch="sm_90",
        dtype="fp32",
        flags=(),
        source_sha256="0" * 64,
        resources=(),
        entries=(),
        extern_functions=(),
        global_variables=(),
        special_registers=(),
        log="",
        cache_hit=False,
    )
    request = TimingRequest(
        GELU,
        build,
        None,
        SHAPE,
        seed=5,
        seeds=(11, 12),
        recheck_seed=None,
        rotate_bytes=0,
        min_runs=10,
        min_seconds=0.1,
        call_seconds=0.5,
    )
    run = CudaBackend(cache_dir=tmp_path, bench_limits=LIMITS).time(request)
    assert [job.call_timeout_s for job in jobs] == [0.5]
    assert run.rejection is not None
    assert (run.rejection.stage, run.rejection.reason) == ("benchmark", "timeout")
    assert "0.5 s deadline" in run.rejection.message
