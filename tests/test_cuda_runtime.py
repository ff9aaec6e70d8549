"""The CUDA runtime: device probe, runner protocol, baselines, and (on a GPU) real runs.

Without a GPU the GPU tests skip with the probe's reason, and running or timing raises
NoGpu: a GPU-less host never produces a result.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from gpu_workers import runner_files as files
from gpu_workers.benchmarking import judge_calls
from gpu_workers.cuda import backend as cuda_backend
from gpu_workers.cuda import baselines, fresh
from gpu_workers.cuda import protocol as p
from gpu_workers.cuda import timing as cuda_timing
from gpu_workers.cuda.backend import VERIFY_LIMITS, CudaBackend
from gpu_workers.cuda.baselines import ARRAY_FORMULAS, choose_baseline, has_formula
from gpu_workers.cuda.calibrate import CalibrationError, matmul_library, measure
from gpu_workers.cuda.device import (
    DeviceInfo,
    Library,
    NoGpu,
    benchmark_unavailable_reason,
    calibration_unavailable_reason,
    cuda_env,
    device_arch,
    gpu_unavailable_reason,
    unavailable_reason,
)
from gpu_workers.cuda.driver import Loaded, pack
from gpu_workers.cuda.nvcc import CudaBuild, nvcc_path
from gpu_workers.cuda.runner import FAULT_EXIT, HARNESS_EXIT
from gpu_workers.deadlines import at_shape
from gpu_workers.protocols import TimingRequest
from gpu_workers.results import Rejection, SandboxReport
from gpu_workers.sandbox import Limits, SandboxOutcome, run_sandboxed
from gpu_workers.verification import check_outputs, plan_trials, verify
from kernels.builtin import BUILTIN, GELU
from kernels.cuda_launch import parse_launch_plan
from kernels.templates import TEMPLATES

NO_GPU = gpu_unavailable_reason()


def needs_gpu(test: Callable[..., None]) -> Callable[..., None]:
    """Marked `gpu`; skipped with the device probe's reason on a host without one."""
    skip = pytest.mark.skipif(NO_GPU is not None, reason=f"needs a CUDA GPU: {NO_GPU}")
    return pytest.mark.gpu(skip(test))


without_gpu = pytest.mark.skipif(NO_GPU is None, reason="this host has a GPU")
needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")

GELU_BODY = """
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
"""


def gelu_source(guard: str = "i < n", before: str = "") -> str:
    return f"""#include <stdint.h>
// kf-launch: kf_gelu(x, y, n) grid=(cdiv(n, 256)) block=(256)
extern "C" __global__ void kf_gelu(const float *x, float *y, int64_t n) {{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    {before}
    if ({guard}) {{{GELU_BODY}    }}
}}
"""


GELU_OK = gelu_source()
GELU_WRITES_PAST_THE_END = gelu_source(guard="i <= n")
GELU_WILD_POINTER = gelu_source(before="if (i == 0) *(volatile float *)(uintptr_t)16 = 1.0f;")
GELU_TRAPS_ON_WRITTEN_OUTPUT = gelu_source(before="if (i < n && y[i] == y[i]) __trap();")
GELU_NEVER_ENDS = gelu_source(
    before="volatile const float *vx = x; while (vx[0] == vx[0] || n > 0) { }"
)
HANGS_FROM = 1 << 22
"""Beyond every shape verification runs GELU at (its contract shapes reach 2^20 + 4096)."""
GELU_HANGS_AT_THE_TIMED_SHAPE = gelu_source(
    before="volatile const float *vx = x; "
    f"while (n >= {HANGS_FROM} && (vx[0] == vx[0] || n > 0)) {{ }}"
)


# Protocol -----------------------------------------------------------------------------


def test_jobs_and_replies_survive_the_trip_to_the_runner() -> None:
    ref = p.KernelRef(cubin="/c/k.cubin", source="/c/k.cu")
    messages: list[Any] = [
        p.VerifyJob(
            kernel=ref,
            problem="softmax",
            dtype="bf16",
            trials=[
                p.TrialJob(
                    index=0, shape={"rows": 3, "cols": 7}, distribution="ties", seed=9, runs=2
                )
            ],
        ),
        p.BenchJob(
            kernel=ref,
            incumbent=None,
            baseline="naive_cuda",
            baseline_kernel=ref,
            problem="/x/my.py:OP",
            dtype="fp16",
            shape={"n": 5},
            seeds=[1, 2],
            rechecks=[p.RecheckJob(distribution="uniform", seed=3)],
            secret_seed=(1 << 63) - 1,
            judged_calls=3,
            refresh_cubin="/c/refresh.cubin",
            l2_flush_bytes=100 << 20,
        ),
        p.CalibrateJob(
            copy_bytes=1 << 30, matmul_n=8192, dtypes=["fp32", "bf16"], matmul_library="cupy"
        ),
    ]
    for message in messages:
        assert msgspec.json.decode(msgspec.json.encode(message), type=p.Job) == message
    replies: list[Any] = [
        files.VerifyReply(runs=[files.RunRecord(trial=0, run=1, damaged_slack=["y"], seconds=0.5)]),
        p.BenchReply(
            kernel_ns=[5, 6],
            kernel_warmup_ns=[9],
            baseline_ns=[7],
            incumbent_ns=[],
            input_sets=2,
            rotated_bytes=80,
            timed_seconds=0.5,
            baseline="torch 2.11 eager: torch.softmax(x, dim=-1)",
            l2_flush_bytes=1 << 27,
            cache_policy="flushed",
            secret_seed=12345,
            kernel_calls=40,
            judged=[p.JudgedCall(slot=0, call=17, timed=True, input_set=1, refresh=30)],
            rechecks=[p.RecheckJob(distribution="normal", seed=1)],
            input_policy="fresh",
        ),
        p.CalibrateReply(
            device_name="NVIDIA H200",
            pci_bus_id="0000:19:00.0",
            sm_count=132,
            l2_bytes=50 << 20,
            copy_bytes=2 << 30,
            copy_seconds=0.001,
            matmul_n=8192,
            matmul_seconds={"fp32": 0.02},
            matmul_library="torch",
        ),
        p.FaultReply(reason="crashed", message="illegal address", evidence={"cuda_error": "x"}),
    ]
    for reply in replies:
        assert msgspec.json.decode(msgspec.json.encode(reply), type=p.Reply) == reply


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_poison_patterns_are_distinct_nans_no_kernel_would_write(dtype: str) -> None:
    if dtype == "bf16":
        pytest.importorskip("ml_dtypes")
    element = p.element_dtype(dtype)
    poisons = np.array(p.POISON_BITS[dtype], dtype=p.bits_dtype(dtype))
    with np.errstate(invalid="ignore"):
        values = poisons.view(element).astype(np.float64)
    assert np.isnan(values).all()
    assert poisons[0] != poisons[1]
    # Not the NaN arithmetic produces (CUDA's canonical NaN is all ones after the sign,
    # numpy's the quiet bit alone), so a computed NaN is never mistaken for "unwritten".
    computed = {
        np.array([np.nan], dtype=element).view(p.bits_dtype(dtype))[0],
        np.array([-np.nan], dtype=element).view(p.bits_dtype(dtype))[0],
        np.iinfo(p.bits_dtype(dtype)).max >> 1,
    }
    assert not computed & set(poisons.tolist())


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_arrays_travel_as_their_bits(tmp_path: Path, dtype: str) -> None:
    element = p.element_dtype(dtype)
    values = np.array([[1.5, -0.0, np.inf], [3e-5, -7.0, 65000.0]]).astype(element)
    values.view(p.bits_dtype(dtype))[0, 0] = p.POISON_BITS[dtype][1]  # a NaN payload survives
    p.save_bits(tmp_path / "a.npy", values, dtype)
    back = p.load_elements(tmp_path / "a.npy", dtype)
    assert back.dtype == element and back.shape == values.shape
    assert np.array_equal(back.view(p.bits_dtype(dtype)), values.view(p.bits_dtype(dtype)))
    with pytest.raises(ValueError, match="not"):
        p.save_bits(tmp_path / "b.npy", values, "fp32" if dtype != "fp32" else "fp16")


# Device probe and the no-GPU contract ------------------------------------------------------


@without_gpu
def test_the_probe_says_plainly_why_there_is_no_gpu() -> None:
    reason = gpu_unavailable_reason()
    assert reason is not None
    assert reason.startswith(
        ("no CUDA driver", "no CUDA device", "pycuda is not installed", "pycuda failed")
    ), reason
    with pytest.raises(NoGpu, match=reason.split(" (")[0]):
        device_arch()


def _device(cc: tuple[int, int], *, torch: bool = False, cupy: bool = False) -> DeviceInfo:
    return DeviceInfo(
        reason=None,
        name="NVIDIA Test",
        compute_capability=cc,
        pci_bus_id="0000:01:00.0",
        torch=Library(
            usable=torch, note="torch 2.9" if torch else "torch 2.9+cpu: a build without CUDA"
        ),
        cupy=Library(usable=cupy, note="cupy 13.6" if cupy else "cupy is not installed"),
    )


def test_a_gpu_of_an_unknown_architecture_is_refused_with_its_name() -> None:
    """An sm_100 host would fail every compile (no limits for it): it refuses at start-up."""
    assert unavailable_reason(_device((9, 0))) is None
    assert unavailable_reason(_device((8, 6))) is None
    reason = unavailable_reason(_device((10, 0)))
    assert reason is not None
    assert reason.startswith("this GPU (NVIDIA Test) is sm_100; kfactory knows sm_80, ")
    assert "sm_90a" in reason
    assert unavailable_reason(DeviceInfo(reason="no CUDA device")) == "no CUDA device"


def test_calibration_needs_torch_or_cupy_working_with_cuda() -> None:
    reason = calibration_unavailable_reason(_device((9, 0)))
    assert reason is not None
    assert reason.startswith("GPU calibration needs torch or cupy with CUDA: ")
    assert "a build without CUDA" in reason and "cupy is not installed" in reason
    with pytest.raises(CalibrationError, match="needs torch or cupy"):
        matmul_library(_device((9, 0)))
    assert calibration_unavailable_reason(_device((9, 0), cupy=True)) is None
    assert matmul_library(_device((9, 0), cupy=True)) == "cupy"
    assert matmul_library(_device((9, 0), torch=True, cupy=True)) == "torch"


@without_gpu
def test_without_a_gpu_benchmarking_is_refused_for_that_reason_first() -> None:
    assert benchmark_unavailable_reason() == gpu_unavailable_reason()


@without_gpu
@needs_nvcc
def test_without_a_gpu_running_and_timing_refuse_instead_of_faking(tmp_path: Path) -> None:
    backend = CudaBackend(cache_dir=tmp_path)
    assert backend.arch == "sm_90"  # what a GPU-less compile host builds for
    outcome = backend.compile(GELU, GELU_OK, (), "fp32")
    assert outcome.rejection is None, outcome.rejection
    assert isinstance(outcome.build, CudaBuild)
    assert backend.static_check(GELU, outcome.build) is None
    trials = plan_trials(GELU, "fp32", seed=1)
    with pytest.raises(NoGpu, match=r"no CUDA|pycuda"):
        backend.run_trials(GELU, outcome.build, trials)
    with pytest.raises(NoGpu):
        backend.time(
            TimingRequest(
                GELU,
                outcome.build,
                None,
                {"n": 1024},
                seed=5,
                seeds=(1, 2),
                recheck_seed=3,
                rotate_bytes=1 << 20,
                min_runs=3,
                min_seconds=0.0,
            )
        )
    with pytest.raises(NoGpu):
        measure()
    with pytest.raises(NoGpu):
        verify(GELU, backend, GELU_OK, (), dtype="fp32")


@without_gpu
def test_the_runner_without_pycuda_reports_a_harness_fault_never_a_kernel_fault(
    tmp_path: Path,
) -> None:
    """The whole sandbox path: no address-space limit, CUDA environment passed through,
    a reply written and the exit status set even when the runner cannot start CUDA."""
    job = p.VerifyJob(
        kernel=p.KernelRef(cubin=str(tmp_path / "none.cubin"), source=str(tmp_path / "none.cu")),
        problem="gelu",
        dtype="fp32",
        trials=[],
    )
    (tmp_path / files.REQUEST_FILE).write_bytes(msgspec.json.encode(job))
    limits = msgspec.structs.replace(VERIFY_LIMITS, wall_seconds=60.0)
    outcome = run_sandboxed(
        cuda_backend.RUNNER, [], workdir=tmp_path, limits=limits, env=cuda_env()
    )
    reply = msgspec.json.decode((tmp_path / files.RESULT_FILE).read_bytes(), type=p.Reply)
    assert isinstance(reply, p.FaultReply)
    assert reply.harness and reply.reason == "harness_error"
    assert outcome.returncode == HARNESS_EXIT
    assert outcome.report.address_space_limit_bytes == -1
    with pytest.raises(RuntimeError, match="not the kernel's fault"):
        cuda_backend._failure(outcome, tmp_path, "run")


# Failure mapping (the backend's reading of what the runner left) ----------------------------


def _outcome(
    returncode: int, *, timed_out: bool = False, signal: str | None = None
) -> SandboxOutcome:
    return SandboxOutcome(
        returncode=-9 if timed_out else returncode,
        signal_name="SIGKILL" if timed_out else signal,
        timed_out=timed_out,
        cpu_limit_hit=False,
        wall_seconds=120.5 if timed_out else 1.0,
        cpu_seconds=1.0,
        other_cpu_seconds=None,
        stdout="",
        stderr="",
        report=SandboxReport(
            network_isolated=False,
            network_note="test",
            cpu_seconds_limit=240,
            address_space_limit_bytes=-1,
            wall_seconds_limit=120.0,
        ),
    )


def test_a_kernel_fault_becomes_a_rejection_with_the_cuda_error(tmp_path: Path) -> None:
    (tmp_path / files.PROGRESS_FILE).write_text("trial 3 run 1 launch 0 (kf_gelu ...)")
    fault = p.FaultReply(
        reason="crashed",
        message="trial 3 run 1 launch 0: cuCtxSynchronize failed: an illegal memory access",
        evidence={"cuda_error": "cuCtxSynchronize failed: an illegal memory access"},
    )
    (tmp_path / files.RESULT_FILE).write_bytes(msgspec.json.encode(fault))
    rejection = cuda_backend._failure(_outcome(FAULT_EXIT), tmp_path, "run")
    assert isinstance(rejection, Rejection)
    assert (rejection.stage, rejection.reason) == ("run", "crashed")
    assert "illegal memory access" in rejection.evidence["cuda_error"]
    assert rejection.evidence["progress"].startswith("trial 3 run 1")


def test_a_child_killed_by_the_wall_clock_is_a_timeout(tmp_path: Path) -> None:
    (tmp_path / files.PROGRESS_FILE).write_text("timing")
    rejection = cuda_backend._failure(_outcome(0, timed_out=True), tmp_path, "benchmark")
    assert rejection is not None
    assert (rejection.stage, rejection.reason) == ("benchmark", "timeout")
    assert "during timing" in rejection.message
    assert "address space not limited" in rejection.evidence["limits"]


def test_a_runner_without_a_reply_before_any_kernel_work_is_the_harness_fault(
    tmp_path: Path,
) -> None:
    """No reply and no progress: the child died (or hung) starting CUDA."""
    for outcome in (_outcome(-11, signal="SIGSEGV"), _outcome(0, timed_out=True)):
        with pytest.raises(RuntimeError, match="without a reply"):
            cuda_backend._failure(outcome, tmp_path, "run")


@pytest.mark.parametrize(
    "outcome",
    [
        _outcome(-11, signal="SIGSEGV"),
        _outcome(-6, signal="SIGABRT"),
        _outcome(1),
        _outcome(HARNESS_EXIT),
    ],
    ids=["SIGSEGV", "SIGABRT", "exit 1", "harness exit"],
)
def test_a_runner_that_dies_without_a_reply_is_never_the_kernels_fault(
    tmp_path: Path, outcome: SandboxOutcome
) -> None:
    """A CUDA kernel cannot kill its runner: its faults come back as CUDA errors in a
    reply. A signal or an exit without one, wherever the runner was, is the harness's."""
    (tmp_path / files.PROGRESS_FILE).write_text("trial 0 run 0 launch 0 (kf_gelu ...)")
    with pytest.raises(RuntimeError, match="not the kernel's fault"):
        cuda_backend._failure(outcome, tmp_path, "run")
    (tmp_path / files.RESULT_FILE).write_text('{"type": "verify", "runs": [')  # cut short
    with pytest.raises(RuntimeError, match="without a reply"):
        cuda_backend._failure(outcome, tmp_path, "run")


def test_a_wall_clock_kill_after_the_kernel_work_began_is_a_timeout(tmp_path: Path) -> None:
    (tmp_path / files.PROGRESS_FILE).write_text("loading")
    rejection = cuda_backend._failure(_outcome(0, timed_out=True), tmp_path, "run")
    assert rejection is not None
    assert (rejection.stage, rejection.reason) == ("run", "timeout")
    assert "during loading" in rejection.message
    for step in sorted(p.HARNESS_STEPS):  # no kernel call pending: the runner hung itself
        (tmp_path / files.PROGRESS_FILE).write_text(step)
        with pytest.raises(RuntimeError, match=f"progress: {step}"):
            cuda_backend._failure(_outcome(0, timed_out=True), tmp_path, "benchmark")


def test_a_reply_from_a_runner_that_then_failed_is_the_harness_fault(tmp_path: Path) -> None:
    (tmp_path / files.PROGRESS_FILE).write_text("done")
    (tmp_path / files.RESULT_FILE).write_bytes(msgspec.json.encode(files.VerifyReply(runs=[])))
    with pytest.raises(RuntimeError, match="after its reply"):
        cuda_backend._failure(_outcome(-11, signal="SIGSEGV"), tmp_path, "run")


def test_a_finished_run_is_no_failure(tmp_path: Path) -> None:
    (tmp_path / files.RESULT_FILE).write_bytes(msgspec.json.encode(files.VerifyReply(runs=[])))
    assert cuda_backend._failure(_outcome(0), tmp_path, "run") is None


def test_scratch_buffers_that_do_not_fit_a_shape_are_refused_before_the_gpu() -> None:
    """The launches were checked at the test shapes by the static stage; the buffer sizes
    are what the run stage checks before the GPU."""
    source = "// kf-buffer: tmp bytes=4*n-16\n" + GELU_OK
    plan = parse_launch_plan(source, GELU)
    assert cuda_backend._bad_buffers(plan, {"n": 256}) is None
    rejection = cuda_backend._bad_buffers(plan, {"n": 1})
    assert rejection is not None
    assert (rejection.stage, rejection.reason) == ("run", "bad_launch")
    assert "negative size" in rejection.message


@needs_nvcc
def test_launch_lines_that_do_not_fit_a_test_shape_are_refused_statically(
    tmp_path: Path,
) -> None:
    source = GELU_OK.replace("grid=(cdiv(n, 256))", "grid=(n - 1)")
    backend = CudaBackend(cache_dir=tmp_path, arch="sm_90")
    compiled = backend.compile(GELU, source, (), "fp32")
    assert compiled.build is not None, compiled.rejection
    rejection = backend.static_check(GELU, compiled.build)
    assert rejection is not None
    assert (rejection.stage, rejection.reason) == ("static", "bad_launch")
    assert "grid[0] = 0" in rejection.message


def test_launch_arguments_are_laid_out_as_culaunchkernel_reads_them() -> None:
    """Pointers as 64-bit addresses, dims as int64, one pointer to each value."""
    plan = parse_launch_plan(GELU_OK, GELU)
    kernel = Loaded("k", plan, {"kf_gelu": ctypes.c_void_p(1)}, frozenset(GELU.dims))
    launches = plan.resolve({"n": 300})
    [packed] = pack(kernel, launches, {"x": 0x7F0000001000, "y": 0x7F0000002000}, {"n": 300})
    assert (packed.launch.grid, packed.launch.block) == ((2, 1, 1), (256, 1, 1))
    addresses = [packed.params[i] for i in range(3)]
    assert ctypes.c_uint64.from_address(addresses[0]).value == 0x7F0000001000
    assert ctypes.c_uint64.from_address(addresses[1]).value == 0x7F0000002000
    assert ctypes.c_int64.from_address(addresses[2]).value == 300


# Baselines --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ARRAY_FORMULAS))
def test_array_baselines_compute_what_the_reference_does(name: str) -> None:
    """The cupy baseline's formulas, run by numpy: right answers, so the time compared
    against is the time of the same computation."""
    problem = BUILTIN[name]
    shape = max(problem.test_shapes, key=problem.nbytes)
    inputs = problem.generate(shape, "normal", 7, "fp32")
    _, formula = ARRAY_FORMULAS[name]
    got = formula(np, {k: v.copy() for k, v in inputs.items()})
    assert set(got) == {a.name for a in problem.outputs}
    for arg in problem.outputs:
        assert got[arg.name].dtype == np.float32
    rejection, _ = check_outputs(
        problem,
        problem.tolerances["fp32"],
        inputs,
        got,
        poison_bits=p.POISON_BITS["fp32"][0],
    )
    assert rejection is None, rejection


def test_a_users_problem_is_never_timed_against_a_formula_it_does_not_compute() -> None:
    mine = dataclasses.replace(BUILTIN["softmax"], spec="/home/me/ops.py:SOFTMAX")
    assert has_formula(BUILTIN["softmax"]) and not has_formula(mine)
    assert choose_baseline(mine, "fp32", {"torch", "cupy"}) == "numpy_host"
    assert choose_baseline(BUILTIN["softmax"], "bf16", {"cupy"}) != "cupy"  # no bfloat16


@pytest.mark.parametrize(
    ("libraries", "dtype", "chosen"),
    [
        ({"torch", "cupy"}, "fp32", "torch"),
        ({"torch"}, "bf16", "torch"),
        ({"cupy"}, "fp32", "cupy"),
        ({"cupy"}, "bf16", "naive_cuda"),
        (set(), "fp32", "naive_cuda"),
    ],
)
def test_the_baseline_is_a_library_only_where_it_works_with_cuda(
    libraries: set[str], dtype: str, chosen: str
) -> None:
    """`libraries` is what the device probe found working: an installed CPU-only torch is
    not in it, so it is never chosen."""
    assert choose_baseline(BUILTIN["softmax"], dtype, libraries) == chosen


def test_a_problem_without_formula_or_template_is_timed_against_numpy() -> None:
    problem = BUILTIN["residual_rmsnorm_gelu"]
    if baselines.naive_template(problem, "fp32") is not None:
        pytest.skip("residual_rmsnorm_gelu has a CUDA template now")
    assert choose_baseline(problem, "fp32", set()) == "numpy_host"


def test_the_naive_baseline_is_the_first_template_written_for_the_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tensor_cores = TEMPLATES["matmul_cuda_tensorcore"]  # bf16 and fp16 only
    tiled = TEMPLATES["matmul_cuda_tiled"]
    assert not tensor_cores.accepts("fp32") and tiled.accepts("fp32")
    monkeypatch.setattr(baselines, "templates_for", lambda name, target: [tensor_cores, tiled])
    matmul = BUILTIN["matmul"]
    assert baselines.naive_template(matmul, "fp32") is tiled
    assert baselines.naive_template(matmul, "bf16") is tensor_cores
    monkeypatch.setattr(baselines, "templates_for", lambda name, target: [tensor_cores])
    assert baselines.naive_template(matmul, "fp32") is None
    assert choose_baseline(matmul, "fp32", set()) == "numpy_host"


# On a GPU ------------------------------------------------------------------------------------


@pytest.fixture
def gpu_backend(tmp_path: Path) -> CudaBackend:
    return CudaBackend(cache_dir=tmp_path, launch_timeout_s=5.0)


@needs_gpu
@needs_nvcc
def test_a_correct_kernel_is_verified_on_the_gpu(gpu_backend: CudaBackend) -> None:
    verdict = verify(GELU, gpu_backend, GELU_OK, (), dtype="fp32", seed=3)
    assert verdict.verified, verdict.rejection
    assert len(verdict.trials) == len(plan_trials(GELU))
    assert verdict.sandbox is not None and verdict.sandbox.address_space_limit_bytes == -1


@needs_gpu
@needs_nvcc
def test_a_write_past_the_end_is_caught_by_the_canary(gpu_backend: CudaBackend) -> None:
    verdict = verify(GELU, gpu_backend, GELU_WRITES_PAST_THE_END, (), dtype="fp32")
    assert verdict.rejection is not None
    assert verdict.rejection.reason == "out_of_bounds_write"
    assert "y" in verdict.rejection.evidence["buffers"].split()


@needs_gpu
@needs_nvcc
def test_an_illegal_address_is_a_crash_with_the_cuda_error(gpu_backend: CudaBackend) -> None:
    verdict = verify(GELU, gpu_backend, GELU_WILD_POINTER, (), dtype="fp32")
    assert verdict.rejection is not None
    assert (verdict.rejection.stage, verdict.rejection.reason) == ("run", "crashed")
    assert "illegal" in verdict.rejection.evidence["cuda_error"].lower()
    assert verdict.rejection.evidence["progress"].startswith("trial 0 run 0 launch 0")


@needs_gpu
@needs_nvcc
def test_a_kernel_that_never_ends_is_a_timeout(gpu_backend: CudaBackend) -> None:
    verdict = verify(GELU, gpu_backend, GELU_NEVER_ENDS, (), dtype="fp32")
    assert verdict.rejection is not None
    assert (verdict.rejection.stage, verdict.rejection.reason) == ("run", "timeout")
    assert "still running after 5 s" in verdict.rejection.message


@needs_gpu
@needs_nvcc
def test_the_sandbox_wall_clock_kills_a_kernel_the_runner_waits_for(tmp_path: Path) -> None:
    backend = CudaBackend(
        cache_dir=tmp_path,
        launch_timeout_s=3600.0,
        verify_limits=Limits(
            cpu_seconds=120, address_space_bytes=-1, wall_seconds=20.0, file_size_bytes=1 << 30
        ),
    )
    verdict = verify(GELU, backend, GELU_NEVER_ENDS, (), dtype="fp32")
    assert verdict.rejection is not None
    assert (verdict.rejection.stage, verdict.rejection.reason) == ("run", "timeout")
    assert "wall-clock limit" in verdict.rejection.message


@needs_gpu
@needs_nvcc
def test_timing_returns_event_samples_a_baseline_and_right_outputs(
    gpu_backend: CudaBackend,
) -> None:
    compiled = gpu_backend.compile(GELU, GELU_OK, (), "fp32")
    assert compiled.build is not None, compiled.rejection
    shape = {"n": 1 << 20}
    seeds, recheck = [11, 12], 13
    timing = gpu_backend.timing(
        GELU,
        compiled.build,
        compiled.build,
        shape,
        secret_seed=77,
        seeds=seeds,
        rechecks=cuda_timing.default_rechecks(GELU, recheck),
        rotate_bytes=0,
        min_runs=10,
        min_seconds=0.1,
    )
    assert timing.rejection is None and timing.reply is not None, timing.rejection
    reply = timing.reply
    assert len(reply.kernel_ns) >= 10 and min(reply.kernel_ns) > 0
    assert len(reply.baseline_ns) >= 10 and len(reply.incumbent_ns) >= 10
    assert reply.baseline
    assert sum(reply.kernel_ns) < reply.timed_seconds * 1e9
    assert [(r.distribution, r.seed) for r in timing.rechecks] == cuda_timing.default_rechecks(
        GELU, recheck
    )
    assert len(timing.judged) == fresh.JUDGED_CALLS
    run = cuda_timing.timing_run(GELU, "fp32", shape, timing)
    assert run.rejection is None, run.rejection
    assert run.kernel_ns == reply.kernel_ns
    assert len(run.judged) == fresh.JUDGED_CALLS + len(GELU.distributions)
    assert judge_calls(GELU, "fp32", run.judged) is None


@needs_gpu
@needs_nvcc
def test_every_timed_call_starts_from_poisoned_outputs(gpu_backend: CudaBackend) -> None:
    """The kernel traps if it finds a number (not the NaN poison) in its output: a timed
    call that could see an earlier call's answer would be a crash."""
    kernel = gpu_backend.compile(GELU, GELU_TRAPS_ON_WRITTEN_OUTPUT, (), "fp32")
    incumbent = gpu_backend.compile(GELU, GELU_OK, (), "fp32")
    assert kernel.build is not None and incumbent.build is not None
    run = gpu_backend.time(
        TimingRequest(
            GELU,
            kernel.build,
            incumbent.build,
            {"n": 1 << 20},
            seed=5,
            seeds=(11, 12),
            recheck_seed=13,
            rotate_bytes=0,
            min_runs=10,
            min_seconds=0.1,
        )
    )
    assert run.rejection is None, run.rejection
    assert len(run.kernel_ns) >= 10


@needs_gpu
@needs_nvcc
def test_a_timed_call_past_its_deadline_is_a_timeout_naming_the_shape(
    gpu_backend: CudaBackend,
) -> None:
    """Issue 35: a kernel that passes verification and hangs only at the timed shape is
    stopped at its call deadline (`TimingRequest.call_seconds`), not at the run's limit."""
    verdict = verify(GELU, gpu_backend, GELU_HANGS_AT_THE_TIMED_SHAPE, (), dtype="fp32", seed=3)
    assert verdict.verified, verdict.rejection
    compiled = gpu_backend.compile(GELU, GELU_HANGS_AT_THE_TIMED_SHAPE, (), "fp32")
    assert compiled.build is not None, compiled.rejection
    shape = {"n": HANGS_FROM}
    run = gpu_backend.time(
        TimingRequest(
            GELU,
            compiled.build,
            None,
            shape,
            seed=5,
            seeds=(11, 12),
            recheck_seed=None,
            rotate_bytes=0,
            min_runs=10,
            min_seconds=0.1,
            call_seconds=1.0,
        )
    )
    assert run.rejection is not None
    assert (run.rejection.stage, run.rejection.reason) == ("benchmark", "timeout")
    assert "1 s deadline" in run.rejection.message
    assert f"at the timed shape n={HANGS_FROM}" in at_shape(run.rejection, shape).message
