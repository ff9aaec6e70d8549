"""A final run in the CPU driver: a campaign's top kernels, each in a kernel host and
arena of its own (`timing_run.Contender`), timed together in one interleaved run with the
baseline (`gpu_workers.interleave.interleave_all`), under a timing run's rules: fresh
inputs for every call, inputs and outputs flushed from the caches, the order rotated each
round, every call judged on sampled rows and a few calls of each in full. There is no
re-check: each contender passed one when it was first timed."""

from __future__ import annotations

import contextlib

import numpy as np

from gpu_workers import runner_files as files
from gpu_workers.benchmarking import judge_calls
from gpu_workers.cpu import protocol as p
from gpu_workers.cpu.kernel_process import KernelEnded, ended_rejection
from gpu_workers.cpu.timing_run import (
    Contender,
    ContentionMeter,
    OutOfBounds,
    baseline_call,
    baseline_inputs,
    cache_flush,
    input_sets,
)
from gpu_workers.interleave import Call, FieldSamples, interleave_all
from gpu_workers.results import Mechanism, Rejection
from kernels.loading import load_problem
from kernels.spec import Problem


def _timed(contender: Contender, name: str) -> Call:
    return lambda _: contender.timed(f"{name} call {contender.process.calls}")


def _failure(problem: Problem, dtype: str, contender: Contender) -> Rejection | None:
    """The first of a contender's judged calls (sampled rows, then whole calls) that is
    wrong, or None."""
    rows = judge_calls(problem, dtype, contender.row_calls())
    return rows or judge_calls(problem, dtype, contender.judged())


def final_run(job: p.FinalJob) -> p.FinalReply:
    problem = load_problem(job.problem)
    secret = np.random.default_rng(job.seed)
    files.write_progress("baseline inputs")
    distinct = baseline_inputs(problem, job, secret)
    flush = cache_flush(job.cache_flush_library)
    samples = FieldSamples(contender_ns=[[] for _ in job.libraries])
    failures: list[Rejection | None] = []
    rejection: Rejection | None = None
    contention: float | None = None
    mechanisms: list[Mechanism] = []
    with contextlib.ExitStack() as hosts:
        try:
            contenders = []
            for n, library in enumerate(job.libraries):
                files.write_progress(f"starting contender {n}")
                contender = Contender(problem, job, library, secret, job.judged_calls, flush)
                hosts.callback(contender.close)
                contenders.append(contender)
            mechanisms = list(contenders[0].process.mechanisms)
            if job.wait_for_window:
                files.write_progress("waiting for the timed window")
                files.wait_for_window()
            meter = ContentionMeter(contenders)
            samples = interleave_all(
                [_timed(c, f"contender {n}") for n, c in enumerate(contenders)],
                baseline_call(problem, distinct, flush),
                input_sets(job),
                warmup=job.warmup,
                rounds=job.min_runs,
                max_seconds=job.max_seconds,
                progress=files.write_progress,
                baseline_every=job.baseline_every_with_incumbent,
            )
            contention = meter.contention()
            files.close_window()
            files.write_progress("judging the timed calls")
            failures = [_failure(problem, job.dtype, c) for c in contenders]
        except (KernelEnded, OutOfBounds) as ended:
            rejection = (
                ended.rejection
                if isinstance(ended, OutOfBounds)
                else ended_rejection("benchmark", ended)
            )
    files.write_progress("done")
    return p.FinalReply(
        contender_ns=samples.contender_ns,
        baseline_ns=samples.baseline_ns,
        rounds=samples.rounds,
        timed_seconds=samples.timed_seconds,
        failures=failures,
        rejection=rejection,
        mechanisms=mechanisms,
        window_contention_cores=contention,
    )
