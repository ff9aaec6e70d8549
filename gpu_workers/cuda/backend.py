"""The CUDA device back end: nvcc builds checked statically here, run only in a sandboxed
child that owns the CUDA context (gpu_workers.cuda.runner).

Without a usable GPU, running and timing raise NoGpu with the reason: never a result.

A kernel's fault comes back from the runner as a FaultReply with the CUDA error (device
code cannot reach the runner's host memory, and printf/malloc are refused statically),
so a runner that ends without a reply is the harness's failure, not the kernel's, unless
the sandbox's wall clock stopped it while it waited on the kernel (`_failure`).

The CUDA child runs without an address-space limit (the driver reserves a very large
virtual address range at start-up and fails under any RLIMIT_AS a kernel's data would
fit in); the SandboxReport says so with address_space_limit_bytes = -1.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpu_workers import runner_files as files
from gpu_workers.compile_failure import CompileFailure, compile_rejection
from gpu_workers.cuda import protocol as p
from gpu_workers.cuda.arch import DEFAULT_ARCH
from gpu_workers.cuda.baselines import NAIVE_CUDA, choose_baseline, naive_template
from gpu_workers.cuda.call_clock import GRACE_SECONDS, CallOverran, deadline_watch
from gpu_workers.cuda.device import (
    cuda_env,
    cuda_libraries,
    device_arch,
    gpu_unavailable_reason,
    require_gpu,
)
from gpu_workers.cuda.fresh import JUDGED_CALLS, refresh_cubin
from gpu_workers.cuda.nvcc import (
    CudaBuild,
    compile_cuda,
    default_cache_dir,
    nvcc_identity,
    nvcc_path,
)
from gpu_workers.cuda.static import source_check, static_check
from gpu_workers.cuda.timing import CudaTiming, default_rechecks, read_timing, timing_run
from gpu_workers.held_folder import held_folder
from gpu_workers.protocols import (
    CompileOutcome,
    FinalRequest,
    FinalSamples,
    RunOutcome,
    RunOutput,
    TimingRequest,
    TimingRun,
    Trial,
)
from gpu_workers.results import Rejection
from gpu_workers.runner_files import (
    NO_PROGRESS,
    expect_reply,
    read_progress,
    read_reply,
    write_request,
)
from gpu_workers.sandbox import Limits, SandboxOutcome, run_sandboxed
from gpu_workers.sandbox_outcome import sandbox_failure
from kernels.cuda_launch import LaunchError, LaunchPlan, parse_launch_plan
from kernels.spec import Problem

RUNNER = "gpu_workers.cuda.runner"
UNLIMITED = resource.RLIM_INFINITY
"""No RLIMIT_AS for a CUDA child (reported as -1)."""
VERIFY_LIMITS = Limits(
    cpu_seconds=240, address_space_bytes=UNLIMITED, wall_seconds=120.0, file_size_bytes=1 << 30
)
BENCH_LIMITS = Limits(
    cpu_seconds=1200, address_space_bytes=UNLIMITED, wall_seconds=600.0, file_size_bytes=2 << 30
)
"""CPU time is twice the wall clock: the host thread spins while it waits for the GPU, and a
kernel that never finishes must meet the wall-clock limit (reported as a timeout)."""
LAUNCH_TIMEOUT_S = 20.0


class CudaBackend:
    """Compile, statically check, run and time CUDA kernels on this host's GPU. Its build
    type is CudaBuild: what `compile` makes is what the other stages take."""

    target = "cuda"
    build_type = CudaBuild

    def __init__(
        self,
        *,
        cache_dir: Path | None = None,
        arch: str | None = None,
        verify_limits: Limits = VERIFY_LIMITS,
        bench_limits: Limits = BENCH_LIMITS,
        launch_timeout_s: float = LAUNCH_TIMEOUT_S,
        judged_calls: int = JUDGED_CALLS,
    ) -> None:
        self.cache_dir = cache_dir
        self._arch = arch
        self.verify_limits = verify_limits
        self.bench_limits = bench_limits
        self.launch_timeout_s = launch_timeout_s
        self.judged_calls = judged_calls

    @property
    def arch(self) -> str:
        """The GPU's architecture when this host has one, else the constructor's or sm_90."""
        if self._arch is None:
            self._arch = device_arch() if gpu_unavailable_reason() is None else DEFAULT_ARCH
        return self._arch

    def compile(
        self, problem: Problem, source: str, flags: tuple[str, ...], dtype: str = "fp32"
    ) -> CompileOutcome:
        """The includes first (a static-stage refusal, before nvcc reads anything), then
        compile_cuda."""
        unsafe = source_check(source)
        if unsafe is not None:
            return CompileOutcome(build=None, rejection=unsafe)
        result = compile_cuda(
            source, flags, problem=problem, dtype=dtype, arch=self.arch, cache_dir=self.cache_dir
        )
        if isinstance(result, CompileFailure):
            return CompileOutcome(build=None, rejection=compile_rejection(result))
        return CompileOutcome(build=result, rejection=None, cache_hit=result.cache_hit)

    def static_check(self, problem: Problem, build: CudaBuild) -> Rejection | None:
        shapes = tuple(problem.full_shape(s) for s in (*problem.test_shapes, problem.default_shape))
        return static_check(build, _plan(problem, build), shapes=shapes)

    def run_trials(self, problem: Problem, build: CudaBuild, trials: list[Trial]) -> RunOutcome:
        """Run the trials in the sandboxed runner. The launches were checked at the test
        shapes by static_check; what is new here is the scratch buffers' sizes."""
        require_gpu()
        plan = _plan(problem, build)
        for trial in trials:
            bad = _bad_buffers(plan, trial.shape)
            if bad is not None:
                return RunOutcome(rejection=bad)
        with held_folder("kf-cuda-verify-") as workdir:
            jobs = []
            for trial in trials:
                for name, array in trial.inputs.items():
                    p.save_bits(workdir / files.input_file(trial.index, name), array, build.dtype)
                jobs.append(
                    p.TrialJob(
                        index=trial.index,
                        shape=trial.shape,
                        distribution=trial.distribution,
                        seed=trial.seed,
                        runs=trial.runs,
                    )
                )
            job = p.VerifyJob(
                kernel=_ref(build),
                problem=problem.load_spec,
                dtype=build.dtype,
                trials=jobs,
                launch_timeout_s=self.launch_timeout_s,
            )
            outcome = _run(job, workdir, self.verify_limits)
            failure = _failure(outcome, workdir, "run")
            if failure is not None:
                return RunOutcome(rejection=failure, sandbox=outcome.report)
            reply = expect_reply(workdir, p.Reply, files.VerifyReply)
            runs = [
                RunOutput(
                    trial=r.trial,
                    run=r.run,
                    poison_bits=p.POISON_BITS[build.dtype][r.run % 2],
                    outputs={
                        a.name: p.load_elements(
                            workdir / files.out_file(r.trial, r.run, a.name), build.dtype
                        )
                        for a in problem.outputs
                    },
                    inputs_after={
                        a.name: p.load_elements(
                            workdir / files.after_file(r.trial, r.run, a.name), build.dtype
                        )
                        for a in problem.inputs
                    },
                    damaged_slack=tuple(r.damaged_slack),
                )
                for r in reply.runs
            ]
            return RunOutcome(runs=runs, sandbox=outcome.report)

    def time_final(self, request: FinalRequest[CudaBuild]) -> FinalSamples:
        """Not supported here yet: the campaign records the refusal and finishes on its
        pooled ranking."""
        return FinalSamples(
            rejection=Rejection(
                stage="benchmark",
                reason="final_run_not_supported",
                message="the cuda back end does not support a final run of N kernels",
            )
        )

    def time(self, request: TimingRequest[CudaBuild]) -> TimingRun:
        """Time the kernel, its baseline and the incumbent, interleaved, by CUDA events,
        on inputs drawn afresh before every timed call; L2 is flushed before every timed
        call (by writing at least `rotate_bytes`). `seed` is the check's secret: it draws
        the fresh inputs and the judged calls. The result in the benchmarker's terms
        (`timing_run`): the judged calls and the re-checks are judged there. The device
        is held for the whole run: `window_open` is called first, `window_closed` not."""
        if request.window_open is not None:
            request.window_open()
        problem, recheck_seed = request.problem, request.recheck_seed
        timing = self.timing(
            problem,
            request.build,
            request.incumbent,
            request.shape,
            secret_seed=request.seed,
            seeds=list(request.seeds),
            rechecks=[] if recheck_seed is None else default_rechecks(problem, recheck_seed),
            rotate_bytes=request.rotate_bytes,
            min_runs=request.min_runs,
            min_seconds=request.min_seconds,
            call_seconds=request.call_seconds,
            watch=request.watch,
        )
        return timing_run(problem, request.build.dtype, request.shape, timing)

    def timing(
        self,
        problem: Problem,
        build: CudaBuild,
        incumbent: CudaBuild | None,
        shape: dict[str, int],
        *,
        secret_seed: int,
        seeds: list[int],
        rechecks: Sequence[tuple[str, int]],
        rotate_bytes: int,
        min_runs: int,
        min_seconds: float,
        call_seconds: float | None = None,
        watch: Callable[[], None] | None = None,
    ) -> CudaTiming:
        """One timing run in the sandboxed runner, as it came back: the samples, the
        judged calls' inputs and outputs, the re-checks' outputs. `seeds` generate the
        reservoir the fresh inputs are drawn from; `secret_seed` draws the refreshes and
        the judged calls (the same seed replays both). `call_seconds`: each timed call's
        deadline (`gpu_workers.deadlines`; None: `protocol.CALL_TIMEOUT_S`); `watch` as
        `TimingRequest.watch`."""
        require_gpu()
        choice = choose_baseline(problem, build.dtype, cuda_libraries())
        secret = secret_seed
        job = p.BenchJob(
            kernel=_ref(build),
            incumbent=_ref(incumbent) if incumbent is not None else None,
            baseline=choice,
            baseline_kernel=self._naive_baseline(problem, build)
            if choice == "naive_cuda"
            else None,
            problem=problem.load_spec,
            dtype=build.dtype,
            shape=shape,
            seeds=seeds,
            rechecks=[p.RecheckJob(distribution=d, seed=s) for d, s in rechecks],
            secret_seed=secret,
            judged_calls=self.judged_calls,
            refresh_cubin=str(self._refresh_cubin(build.arch)),
            l2_flush_bytes=rotate_bytes,
            min_runs=min_runs,
            min_seconds=min_seconds,
            call_timeout_s=p.CALL_TIMEOUT_S if call_seconds is None else call_seconds,
        )
        return run_timing(problem, job, self.bench_limits, watch)

    def _refresh_cubin(self, arch: str) -> Path:
        """The harness's refresh kernel for `arch` (built by nvcc once, then cached)."""
        nvcc = nvcc_path()
        if nvcc is None:
            raise RuntimeError(
                "nvcc is not on PATH: the refresh kernel of the timing runs needs it"
            )
        return refresh_cubin(nvcc, nvcc_identity(nvcc), arch, self.cache_dir or default_cache_dir())

    def _naive_baseline(self, problem: Problem, build: CudaBuild) -> p.KernelRef:
        template = naive_template(problem, build.dtype)
        if template is None:
            raise ValueError(
                f"{problem.name} has no CUDA template for {build.dtype} to build a baseline from"
            )
        rendered = template.render(template.defaults, build.dtype)
        result = compile_cuda(
            rendered.source,
            rendered.flags,
            problem=problem,
            dtype=build.dtype,
            arch=build.arch,
            cache_dir=self.cache_dir,
        )
        if isinstance(result, CompileFailure):
            raise RuntimeError(
                f"the {NAIVE_CUDA} baseline {template.name} failed to build: "
                f"{result.reason}: {result.message}\n{result.log}"
            )
        return _ref(result)


def _ref(build: CudaBuild) -> p.KernelRef:
    return p.KernelRef(cubin=build.cubin, source=build.source)


def _bad_buffers(plan: LaunchPlan, shape: dict[str, int]) -> Rejection | None:
    """A kf-buffer whose size does not fit a trial's shape (the launches were checked at
    the test shapes by the static stage)."""
    try:
        plan.buffer_bytes(shape)
    except LaunchError as exc:
        return Rejection(
            stage="run",
            reason="bad_launch",
            message=f"the kf-buffer lines do not fit the shape {shape}: {exc}",
            evidence={"shape": str(shape)},
        )
    return None


def run_timing(
    problem: Problem,
    job: p.BenchJob,
    limits: Limits,
    watch: Callable[[], None] | None = None,
    *,
    runner: str = RUNNER,
    grace_s: float = GRACE_SECONDS,
) -> CudaTiming:
    """Run a timing job in the sandboxed `runner` and read what came back. A timed call
    still running `grace_s` past its deadline (`job.call_timeout_s`) has the runner
    killed (`call_clock`), the kernel rejected as `timeout`: the runner's own check ends
    it at the deadline unless its host thread is stuck."""
    poison = p.POISON_BITS[job.dtype]
    with held_folder("kf-cuda-bench-") as workdir:
        overran = deadline_watch(workdir, job.call_timeout_s, grace_s)

        def watching() -> None:
            if watch is not None:
                watch()
            overran()

        started = time.monotonic()
        sandbox = None
        try:
            outcome = _run(job, workdir, limits, watching, runner)
        except CallOverran as late:
            rejection = late.rejection(read_progress(workdir))
            wall = time.monotonic() - started
        else:
            failure = _failure(outcome, workdir, "benchmark")
            if failure is None:
                reply = expect_reply(workdir, p.Reply, p.BenchReply)
                return read_timing(problem, job.dtype, workdir, reply, outcome, poison)
            rejection, wall, sandbox = failure, outcome.wall_seconds, outcome.report
    return CudaTiming(
        reply=None,
        rejection=rejection,
        secret_seed=job.secret_seed,
        wall_seconds=wall,
        poison_bits=poison,
        sandbox=sandbox,
    )


def _run(
    job: p.Job,
    workdir: Path,
    limits: Limits,
    watch: Callable[[], None] | None = None,
    runner: str = RUNNER,
) -> SandboxOutcome:
    write_request(workdir, job)
    return run_sandboxed(runner, [], workdir=workdir, limits=limits, env=cuda_env(), watch=watch)


def _failure(outcome: SandboxOutcome, workdir: Path, stage: str) -> Rejection | None:
    """A rejection for a kernel that faulted or did not finish; None if the run finished.

    A kernel's fault is a FaultReply with a reason in KERNEL_FAULTS. Without a reply the
    kernel is to blame only when the sandbox's wall clock stopped a runner that had begun
    its kernel work (the progress file exists and names no step of HARNESS_STEPS): a
    kernel that never ends, waited on past the limit. Anything else raises: a harness
    fault, a signal or an exit without a reply, a reply from a runner that then failed, a
    hang starting CUDA or in the harness's own steps; none says anything about the kernel."""
    reply = read_reply(workdir, p.Reply)
    if isinstance(reply, p.FaultReply):
        if reply.harness or reply.reason not in p.KERNEL_FAULTS:
            raise RuntimeError(
                f"the CUDA runner failed (not the kernel's fault): {reply.message}\n"
                f"{reply.evidence.get('traceback', '')}{outcome.stderr[-2000:]}"
            )
        return Rejection(
            stage=stage,  # type: ignore[arg-type]
            reason=reply.reason,
            message=reply.message,
            evidence={
                **reply.evidence,
                "progress": read_progress(workdir),
                "exit_status": str(outcome.returncode),
                "wall_seconds": f"{outcome.wall_seconds:.2f}",
                "stderr": outcome.stderr[-4000:],
            },
        )
    if reply is not None and outcome.ok:
        return None
    progress = read_progress(workdir)
    if reply is None and outcome.timed_out and progress not in {NO_PROGRESS, *p.HARNESS_STEPS}:
        return sandbox_failure(outcome, workdir, stage)
    raise RuntimeError(
        "the CUDA runner ended "
        + ("after its reply" if reply is not None else "without a reply")
        + " (not the kernel's fault: a kernel's faults come back as CUDA errors in a "
        f"reply): exit status {outcome.returncode}, signal {outcome.signal_name or '-'}, "
        f"{'timed out, ' if outcome.timed_out else ''}progress: {progress}; "
        f"stderr: {outcome.stderr[-2000:]}"
    )


def _plan(problem: Problem, build: CudaBuild) -> LaunchPlan:
    """The launch lines of the build's source (a few lines: parsing them is cheap)."""
    return parse_launch_plan(Path(build.source).read_text(), problem)
