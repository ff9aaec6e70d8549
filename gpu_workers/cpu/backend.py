"""The CPU device back end: C through the system compiler, run only in the sandbox."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpu_workers import runner_files as files
from gpu_workers.benchmarker import TimingRun
from gpu_workers.compile_failure import CompileFailure, compile_rejection
from gpu_workers.cpu import protocol as p
from gpu_workers.cpu.compiler import CompiledKernel, compile_kernel
from gpu_workers.cpu.static import source_check, static_check
from gpu_workers.results import Rejection
from gpu_workers.runner_files import expect_reply, write_request
from gpu_workers.sandbox import Limits, SandboxOutcome, run_sandboxed, sandbox_dir
from gpu_workers.sandbox_outcome import contention, sandbox_failure
from gpu_workers.verifier import CompileOutcome, RunOutcome, RunOutput, Trial
from kernels.spec import Problem

RUNNER = "gpu_workers.cpu.runner"
VERIFY_ENV = {"OMP_WAIT_POLICY": "ACTIVE"}
TIMING_ENV = {
    "GOMP_SPINCOUNT": "10000",
    "OPENBLAS_THREAD_TIMEOUT": "4",
    "OMP_PROC_BIND": "spread",
    "OMP_PLACES": "cores",
}
VERIFY_LIMITS = Limits(
    cpu_seconds=120, address_space_bytes=4 << 30, wall_seconds=60.0, file_size_bytes=256 << 20
)
BENCH_LIMITS = Limits(
    cpu_seconds=1200, address_space_bytes=8 << 30, wall_seconds=600.0, file_size_bytes=1 << 30
)


class CpuBackend:
    """Compile, statically check, run and time C kernels on this host."""

    target = "cpu"

    def __init__(
        self,
        *,
        cache_dir: Path | None = None,
        verify_limits: Limits = VERIFY_LIMITS,
        bench_limits: Limits = BENCH_LIMITS,
        dtype: str = "fp32",
    ) -> None:
        self.cache_dir = cache_dir
        self.verify_limits = verify_limits
        self.bench_limits = bench_limits
        self.dtype = dtype

    def compile(
        self, problem: Problem, source: str, flags: tuple[str, ...], dtype: str = "fp32"
    ) -> CompileOutcome:
        if dtype != self.dtype:
            message = f"this back end builds {self.dtype} kernels, not {dtype}"
            return CompileOutcome(
                build=None,
                rejection=Rejection(stage="compile", reason="unsupported_dtype", message=message),
            )
        unsafe = source_check(source, flags, prototype=problem.c_signature(self.dtype))
        if unsafe is not None:
            return CompileOutcome(build=None, rejection=unsafe)
        result = compile_kernel(
            source, flags, prototype=problem.c_signature(self.dtype), cache_dir=self.cache_dir
        )
        if isinstance(result, CompileFailure):
            return CompileOutcome(build=None, rejection=compile_rejection(result))
        return CompileOutcome(build=result, rejection=None, cache_hit=result.cache_hit)

    def static_check(self, problem: Problem, build: object) -> Rejection | None:
        assert isinstance(build, CompiledKernel)
        return static_check(build)

    def run_trials(self, problem: Problem, build: object, trials: list[Trial]) -> RunOutcome:
        assert isinstance(build, CompiledKernel)
        names = [a.name for a in problem.args]
        outputs = [a.output for a in problem.args]
        with sandbox_dir("kf-verify-") as workdir:
            jobs = []
            for trial in trials:
                for name, array in trial.inputs.items():
                    np.save(workdir / files.input_file(trial.index, name), array)
                jobs.append(
                    p.TrialJob(
                        index=trial.index,
                        shape=trial.shape,
                        distribution=trial.distribution,
                        seed=trial.seed,
                        arg_shapes=[list(a.shape(trial.shape)) for a in problem.args],
                        dims=[int(trial.shape[d]) for d in problem.dims],
                        runs=trial.runs,
                    )
                )
            job = p.VerifyJob(library=build.library, arg_names=names, outputs=outputs, trials=jobs)
            outcome = self._run(job, workdir, self.verify_limits)
            failure = sandbox_failure(outcome, workdir, "run")
            if failure is not None:
                return RunOutcome(rejection=failure, sandbox=outcome.report)
            reply = expect_reply(workdir, p.Reply, files.VerifyReply)
            runs = [
                RunOutput(
                    trial=r.trial,
                    run=r.run,
                    poison_bits=p.POISON_BITS[r.run % len(p.POISON_BITS)],
                    outputs={
                        a.name: np.load(workdir / files.out_file(r.trial, r.run, a.name))
                        for a in problem.outputs
                    },
                    inputs_after={
                        a.name: np.load(workdir / files.after_file(r.trial, r.run, a.name))
                        for a in problem.inputs
                    },
                    damaged_slack=tuple(r.damaged_slack),
                )
                for r in reply.runs
            ]
            return RunOutcome(runs=runs, sandbox=outcome.report)

    def time(
        self,
        problem: Problem,
        build: object,
        incumbent: object | None,
        shape: dict[str, int],
        *,
        seeds: list[int],
        recheck_seed: int,
        rotate_bytes: int,
        min_runs: int,
        min_seconds: float,
    ) -> TimingRun:
        assert isinstance(build, CompiledKernel)
        assert incumbent is None or isinstance(incumbent, CompiledKernel)
        job = p.BenchJob(
            library=build.library,
            incumbent_library=incumbent.library if incumbent is not None else None,
            problem=problem.load_spec,
            dtype=self.dtype,
            shape=shape,
            seeds=seeds,
            recheck_seed=recheck_seed,
            rotate_bytes=rotate_bytes,
            min_runs=min_runs,
            min_seconds=min_seconds,
        )
        with sandbox_dir("kf-bench-") as workdir:
            outcome = self._run(job, workdir, self.bench_limits)
            failure = sandbox_failure(outcome, workdir, "benchmark")
            if failure is not None:
                return TimingRun(rejection=failure, wall_seconds=outcome.wall_seconds)
            reply = expect_reply(workdir, p.Reply, p.BenchReply)
            return TimingRun(
                kernel_ns=reply.kernel_ns,
                kernel_warmup_ns=reply.kernel_warmup_ns,
                baseline_ns=reply.baseline_ns,
                incumbent_ns=reply.incumbent_ns,
                input_sets=reply.input_sets,
                rotated_bytes=reply.rotated_bytes,
                timed_outputs=[
                    {
                        a.name: np.load(workdir / files.timed_out_file(i, a.name))
                        for a in problem.outputs
                    }
                    for i in range(len(seeds))
                ],
                recheck_outputs={
                    a.name: np.load(workdir / files.recheck_file(a.name)) for a in problem.outputs
                },
                wall_seconds=outcome.wall_seconds,
                timed_seconds=reply.timed_seconds,
                host_contention_cores=contention(outcome),
                timed_poison_bits=p.POISON_BITS[0],
                recheck_poison_bits=p.POISON_BITS[1],
            )

    def _run(self, job: p.Job, workdir: Path, limits: Limits) -> SandboxOutcome:
        write_request(workdir, job)
        # Verifying: spinning OpenMP threads start together, which is what exposes races.
        # Timing: idle threads of one contender (OpenMP or OpenBLAS) must not spin on the
        # cores the next contender is using, so both pools go to sleep soon after a call;
        # OpenMP threads are pinned one per core, so no run finds two sharing a core.
        env = VERIFY_ENV if isinstance(job, p.VerifyJob) else TIMING_ENV
        return run_sandboxed(RUNNER, [], workdir=workdir, limits=limits, env=env)
