"""The CPU device back end: C through the system compiler; a kernel runs only in a kernel
host started by the sandboxed driver (runner.py), never beside the harness."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from gpu_workers import runner_files as files
from gpu_workers.compile_failure import CompileFailure, compile_rejection
from gpu_workers.cpu import protocol as p
from gpu_workers.cpu.build import CompiledKernel, compile_kernel
from gpu_workers.cpu.static import file_reader_check, source_check, static_check
from gpu_workers.cpu.timing_run import arena_bytes
from gpu_workers.cpu.toolchain import nan_safe
from gpu_workers.cpu.trusted_build import cache_flush_library, fresh_inputs_library, kernel_host
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
from gpu_workers.recheck_pool import RecheckPool
from gpu_workers.results import Mechanism, Rejection, SandboxReport
from gpu_workers.runner_files import expect_reply, write_request
from gpu_workers.sandbox import Limits, SandboxOutcome, run_sandboxed
from gpu_workers.sandbox_outcome import contention
from gpu_workers.verification import new_seed
from kernels.spec import Problem

RUNNER = "gpu_workers.cpu.runner"
KEPT_BYTES = 1 << 30
DRIVER_ENV = {
    "OPENBLAS_THREAD_TIMEOUT": "4",
    "OMP_WAIT_POLICY": "PASSIVE",
    "MALLOC_ARENA_MAX": "1",
    "GLIBC_TUNABLES": f"glibc.malloc.mmap_threshold={KEPT_BYTES}"
    f":glibc.malloc.trim_threshold={KEPT_BYTES}",
}
"""The driver's own environment.

- Idle BLAS threads of the baseline go to sleep soon, and the OpenMP threads of the
  fresh-input generator at once, so they never spin on the cores the kernel is timed on.
  Spinning for about 10 ms after each refill, they slowed a kernel whose threads are bound
  to those cores and split the work evenly (a static schedule), and a dynamic schedule
  looked faster than it is.
- The driver keeps the memory it frees (every thread on one heap, blocks up to
  `KEPT_BYTES` from it and that much free memory left on it). glibc otherwise hands each
  block of 32 MiB or more back when it is freed, and the next one is fresh pages that the
  OS zeroes, slowly on a VM and more slowly the busier the host. numpy's softmax at
  4096x4096 allocates three 64 MiB arrays a call: paying fresh pages, it took 47-60 ms a
  call on an idle 2-core EPYC VM (27-33 ms on kept memory), and its run medians in
  campaigns spread from 44 to 332 ms, so a speedup over it said more about the host's
  memory at that moment than about the kernel. The kernel writes into outputs mapped
  before its window; the baseline now works on mapped memory too. The judges after the
  window reuse their hundreds of MiB per call the same way.

The kernel's own environment is HOST_ENV."""
VERIFY_LIMITS = Limits(
    cpu_seconds=120, address_space_bytes=4 << 30, wall_seconds=60.0, file_size_bytes=256 << 20
)
BENCH_LIMITS = Limits(
    cpu_seconds=1200, address_space_bytes=8 << 30, wall_seconds=600.0, file_size_bytes=1 << 30
)
"""What the kernel's process may use over a whole verification or timing run."""
DRIVER_SLACK_SECONDS = 120.0
"""The driver outlives its kernel's limits by this much, so a kernel's ending is always
reported by the driver, never mistaken for the driver's own."""
RUN_DIR_PREFIX = "kf-run-"
"""Verification and timing run in folders named alike: nothing says which one it is."""


class HarnessError(RuntimeError):
    """The driver itself failed: the harness's fault, never the kernel's."""


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
        recheck_pool: bool = False,
    ) -> None:
        """`recheck_pool`: keep the re-check's inputs and references for every kernel this
        back end times (a long-lived worker's), in a secret pool (`gpu_workers.recheck_pool`)."""
        self.recheck_pool = RecheckPool() if recheck_pool else None
        self.cache_dir = cache_dir
        self.verify_limits = verify_limits
        self.bench_limits = bench_limits
        self.dtype = dtype

    def _kernel_host(self, limits: Limits, call_seconds: float | None = None) -> p.KernelHostJob:
        return p.KernelHostJob(
            host=str(kernel_host(self.cache_dir)),
            address_space_bytes=limits.address_space_bytes,
            cpu_seconds=limits.cpu_seconds,
            wall_seconds=limits.wall_seconds,
            call_seconds=call_seconds,
        )

    def compile(
        self, problem: Problem, source: str, flags: tuple[str, ...], dtype: str = "fp32"
    ) -> CompileOutcome[CompiledKernel]:
        if dtype != self.dtype:
            message = f"this back end builds {self.dtype} kernels, not {dtype}"
            return CompileOutcome(
                build=None,
                rejection=Rejection(stage="compile", reason="unsupported_dtype", message=message),
            )
        flags = nan_safe(flags)
        reads = file_reader_check(source)
        if reads is not None:
            return CompileOutcome(build=None, rejection=reads)
        prototype = problem.c_signature(self.dtype)
        result = compile_kernel(source, flags, prototype=prototype, cache_dir=self.cache_dir)
        if isinstance(result, CompileFailure):
            # the static stage's findings first: the build's own scan, not run again
            unsafe = source_check(source, flags, prototype=prototype)
            return CompileOutcome(build=None, rejection=unsafe or compile_rejection(result))
        # built (now, or before: the cache keeps only builds whose scan was clean)
        return CompileOutcome(build=result, rejection=None, cache_hit=result.cache_hit)

    def static_check(self, problem: Problem, build: CompiledKernel) -> Rejection | None:
        return static_check(build)

    def run_trials(
        self, problem: Problem, build: CompiledKernel, trials: list[Trial]
    ) -> RunOutcome:
        names = [a.name for a in problem.args]
        outputs = [a.output for a in problem.args]
        with held_folder(RUN_DIR_PREFIX) as workdir:
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
            job = p.VerifyJob(
                library=build.library,
                kernel_host=self._kernel_host(self.verify_limits),
                arg_names=names,
                outputs=outputs,
                trials=jobs,
                layout_seed=new_seed(),
            )
            outcome = self._run(job, workdir, self.verify_limits)
            reply = expect_reply(workdir, p.Reply, files.VerifyReply)
            sandbox = self._report(outcome, self.verify_limits, reply.mechanisms)
            if reply.ended is not None:
                return RunOutcome(rejection=reply.ended, sandbox=sandbox)
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
            return RunOutcome(runs=runs, sandbox=sandbox)

    def time(self, request: TimingRequest[CompiledKernel]) -> TimingRun:
        """The driver sets the run up before `window_open` (kernel processes, arenas,
        inputs), so that this happens while other work still has the host. It flushes
        every call's inputs and outputs from the caches, so `rotate_bytes` (what a back end
        that cannot flush writes between calls) is not used here."""
        incumbent = request.incumbent
        job = p.BenchJob(
            library=request.build.library,
            incumbent_library=incumbent.library if incumbent is not None else None,
            recheck_seed=request.recheck_seed,
            recheck_pool=str(self.recheck_pool.folder) if self.recheck_pool else None,
            min_runs=request.min_runs,
            min_seconds=request.min_seconds,
            half_width=request.half_width,
            **self._run_settings(request),
        )
        with held_folder(RUN_DIR_PREFIX) as workdir:
            outcome = self._run_timed(job, workdir, request)
            reply = expect_reply(workdir, p.Reply, p.BenchReply)
            return TimingRun(
                kernel_ns=reply.kernel_ns,
                kernel_warmup_ns=reply.kernel_warmup_ns,
                baseline_ns=reply.baseline_ns,
                incumbent_ns=reply.incumbent_ns,
                input_sets=reply.input_sets,
                rotated_bytes=reply.rotated_bytes,
                caches_flushed=True,
                judged_calls=reply.judged_calls,
                rechecked=reply.rechecked,
                handshake_ns=reply.handshake_ns,
                kernel_cpu_seconds=reply.kernel_cpu_seconds,
                sandbox=self._report(outcome, self.bench_limits, reply.mechanisms),
                wall_seconds=outcome.wall_seconds,
                timed_seconds=reply.timed_seconds,
                host_contention_cores=_window_contention(reply, outcome),
                rejection=reply.rejection,
            )

    def time_final(self, request: FinalRequest[CompiledKernel]) -> FinalSamples:
        """A final run in the driver (`gpu_workers.cpu.final_run`), set up before
        `window_open` as a timing run is."""
        libraries = [build.library for build in request.builds]
        job = p.FinalJob(
            libraries=libraries,
            library=libraries[0],
            incumbent_library=None,
            recheck_seed=None,
            min_runs=request.rounds,
            max_seconds=request.max_seconds,
            **self._run_settings(request),
        )
        with held_folder(RUN_DIR_PREFIX) as workdir:
            outcome = self._run_timed(job, workdir, request)
            reply = expect_reply(workdir, p.Reply, p.FinalReply)
        return FinalSamples(
            contender_ns=reply.contender_ns,
            baseline_ns=reply.baseline_ns,
            failures=reply.failures,
            rounds=reply.rounds,
            timed_seconds=reply.timed_seconds,
            wall_seconds=outcome.wall_seconds,
            host_contention_cores=_window_contention(reply, outcome),
            caches_flushed=True,
            rejection=reply.rejection,
        )

    def _run_settings(
        self, request: TimingRequest[CompiledKernel] | FinalRequest[CompiledKernel]
    ) -> dict[str, Any]:
        """What a timing job and a final run's job take alike from their request."""
        return {
            "kernel_host": self._kernel_host(self.bench_limits, request.call_seconds),
            "fresh_inputs_library": str(fresh_inputs_library(self.cache_dir)),
            "cache_flush_library": str(cache_flush_library(self.cache_dir)),
            "problem": request.problem.load_spec,
            "dtype": self.dtype,
            "shape": request.shape,
            "seed": request.seed,
            "seeds": list(request.seeds),
            "wait_for_window": request.window_open is not None,
        }

    def _run_timed(
        self,
        job: p.BenchJob,
        workdir: Path,
        request: TimingRequest[CompiledKernel] | FinalRequest[CompiledKernel],
    ) -> SandboxOutcome:
        """Run a timing job in the driver, opening the request's window once the driver
        has set up and closing it when the driver says its timed rounds are over."""
        window_open, window_closed = request.window_open, request.window_closed
        opened = closed = False

        def watch() -> None:
            nonlocal opened, closed
            if request.watch is not None:
                request.watch()
            if window_open is not None and not opened and files.window_ready(workdir):
                window_open()
                opened = True
                files.open_window(workdir)
            if window_closed is not None and not closed and files.window_closed(workdir):
                closed = True
                window_closed()

        arena = arena_bytes(request.problem, job) * (
            len(job.libraries) if isinstance(job, p.FinalJob) else 1
        )
        return self._run(job, workdir, self.bench_limits, watch, arena_bytes=arena)

    @staticmethod
    def _report(
        outcome: SandboxOutcome, limits: Limits, mechanisms: list[Mechanism]
    ) -> SandboxReport:
        """The driver's network isolation, and the kernel process's limits and mechanisms."""
        return msgspec.structs.replace(
            outcome.report,
            cpu_seconds_limit=limits.cpu_seconds,
            address_space_limit_bytes=limits.address_space_bytes,
            wall_seconds_limit=limits.wall_seconds,
            mechanisms=tuple(mechanisms),
        )

    def _run(
        self,
        job: p.Job,
        workdir: Path,
        limits: Limits,
        watch: Callable[[], None] | None = None,
        *,
        arena_bytes: int = 0,
    ) -> SandboxOutcome:
        """Run the driver; a driver that did not finish is the harness's failure. The
        driver may write files of `arena_bytes` beyond the kernel's own file limit (a
        timing run's arenas, sized by the host's cache)."""
        write_request(workdir, job)
        driver = Limits(
            cpu_seconds=limits.cpu_seconds + int(DRIVER_SLACK_SECONDS) * 4,
            address_space_bytes=max(16 << 30, 2 * limits.address_space_bytes),
            wall_seconds=limits.wall_seconds + DRIVER_SLACK_SECONDS,
            file_size_bytes=limits.file_size_bytes + arena_bytes,
        )
        outcome = run_sandboxed(
            RUNNER, [], workdir=workdir, limits=driver, env=DRIVER_ENV, watch=watch
        )
        if not outcome.ok or not (workdir / files.RESULT_FILE).is_file():
            why = "timed out" if outcome.timed_out else f"ended with {outcome.returncode}"
            raise HarnessError(
                f"the CPU driver {why} during {files.read_progress(workdir)}: "
                f"{outcome.stderr[-2000:]}"
            )
        return outcome


def _window_contention(reply: p.BenchReply | p.FinalReply, outcome: SandboxOutcome) -> float | None:
    """Other work on the host during the timed window, as the driver measured it, else over
    the driver's whole run."""
    if reply.window_contention_cores is not None:
        return reply.window_contention_cores
    return contention(outcome)
