"""What a CUDA timing run brings back, and the same in the benchmarker's terms.

The runner (gpu_workers.cuda.runner) writes its BenchReply and, beside it, the inputs
(as given and as left) and outputs of the kernel calls chosen at random by the secret
seed, and the outputs of the re-checks after timing. `read_timing` reads them back as a
CudaTiming; `timing_run` makes the benchmarker's TimingRun of it, whose `judged` calls
the benchmarker judges (gpu_workers.benchmarking.judge_calls): the timed calls on the
inputs read back from the device (drawn there by the secret seed, so only the runner saw
them), the re-checks on inputs generated here again from their (distribution, seed).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gpu_workers.cuda import protocol as p
from gpu_workers.protocols import JudgedCall, TimingRun
from gpu_workers.results import Rejection, SandboxReport
from gpu_workers.sandbox import SandboxOutcome
from gpu_workers.sandbox_outcome import contention
from gpu_workers.verification import trial_seed
from kernels.spec import Arrays, Problem


@dataclasses.dataclass
class CudaCall:
    """A kernel call chosen at random: the inputs it was given, what it wrote, and its
    inputs as it left them."""

    record: p.JudgedCall
    inputs: Arrays
    outputs: Arrays
    inputs_after: Arrays


@dataclasses.dataclass
class Recheck:
    """One call after timing on inputs of (distribution, seed)."""

    distribution: str
    seed: int
    outputs: Arrays
    inputs_after: Arrays


@dataclasses.dataclass
class CudaTiming:
    """One timing run as the CUDA runner reported it (arrays as elements of the dtype)."""

    reply: p.BenchReply | None
    rejection: Rejection | None
    secret_seed: int
    wall_seconds: float
    poison_bits: tuple[int, int]
    """(timed, re-check): the poison of the judged calls' and the re-checks' outputs."""
    judged: list[CudaCall] = dataclasses.field(default_factory=list)
    rechecks: list[Recheck] = dataclasses.field(default_factory=list)
    host_contention_cores: float | None = None
    sandbox: SandboxReport | None = None


def default_rechecks(problem: Problem, recheck_seed: int) -> list[tuple[str, int]]:
    """After timing, one call per distribution the problem is verified over, each on
    inputs of its own seed (as the CPU target re-checks)."""
    return [
        (distribution, trial_seed(recheck_seed, index, distribution))
        for index, distribution in enumerate(problem.distributions)
    ]


def read_timing(
    problem: Problem,
    dtype: str,
    workdir: Path,
    reply: p.BenchReply,
    outcome: SandboxOutcome,
    poison: tuple[int, int],
) -> CudaTiming:
    """The reply and the arrays the runner wrote beside it."""

    def load(name: str) -> Any:
        return p.load_elements(workdir / name, dtype)

    return CudaTiming(
        reply=reply,
        rejection=None,
        secret_seed=reply.secret_seed,
        wall_seconds=outcome.wall_seconds,
        poison_bits=poison,
        judged=[
            CudaCall(
                record=j,
                inputs={a.name: load(p.judged_in_file(j.slot, a.name)) for a in problem.inputs},
                outputs={a.name: load(p.judged_out_file(j.slot, a.name)) for a in problem.outputs},
                inputs_after={
                    a.name: load(p.judged_after_file(j.slot, a.name)) for a in problem.inputs
                },
            )
            for j in reply.judged
        ],
        rechecks=[
            Recheck(
                distribution=r.distribution,
                seed=r.seed,
                outputs={a.name: load(p.recheck_out_file(i, a.name)) for a in problem.outputs},
                inputs_after={
                    a.name: load(p.recheck_after_file(i, a.name)) for a in problem.inputs
                },
            )
            for i, r in enumerate(reply.rechecks)
        ],
        host_contention_cores=contention(outcome),
        sandbox=outcome.report,
    )


def judged_calls(
    problem: Problem, dtype: str, shape: dict[str, int], timing: CudaTiming
) -> list[JudgedCall]:
    """What the benchmarker judges: each judged call on the inputs the runner read back
    before it (the secret seed drew them on the device, so only the runner knows them),
    then each re-check on inputs generated here again from its (distribution, seed)."""
    calls = [
        JudgedCall(
            when=(
                f"{'timed' if c.record.timed else 'warm-up'} call {c.record.call} "
                f"(chosen at random; inputs from refresh {c.record.refresh} of secret seed "
                f"{timing.secret_seed})"
            ),
            inputs=c.inputs,
            outputs=c.outputs,
            inputs_after=c.inputs_after,
            poison_bits=timing.poison_bits[0],
            seed=None,
        )
        for c in timing.judged
    ]
    for r in timing.rechecks:
        calls.append(
            JudgedCall(
                when=f"re-check after timing: {r.distribution} inputs at {shape}, seed {r.seed}",
                inputs=problem.generate(shape, r.distribution, r.seed, dtype),
                outputs=r.outputs,
                inputs_after=r.inputs_after,
                poison_bits=timing.poison_bits[1],
                seed=r.seed,
            )
        )
    return calls


def timing_run(
    problem: Problem, dtype: str, shape: dict[str, int], timing: CudaTiming
) -> TimingRun:
    """The run in the benchmarker's terms; the benchmarker judges `judged`."""
    if timing.rejection is not None or timing.reply is None:
        return TimingRun(
            rejection=timing.rejection, wall_seconds=timing.wall_seconds, sandbox=timing.sandbox
        )
    reply = timing.reply
    return TimingRun(
        kernel_ns=reply.kernel_ns,
        kernel_warmup_ns=reply.kernel_warmup_ns,
        baseline_ns=reply.baseline_ns,
        incumbent_ns=reply.incumbent_ns,
        input_sets=reply.input_sets,
        rotated_bytes=reply.rotated_bytes,
        caches_flushed=True,
        judged=judged_calls(problem, dtype, shape, timing),
        judged_calls=sorted(c.record.call for c in timing.judged),
        rechecked=[r.distribution for r in timing.rechecks],
        sandbox=timing.sandbox,
        wall_seconds=timing.wall_seconds,
        timed_seconds=reply.timed_seconds,
        host_contention_cores=timing.host_contention_cores,
        baseline_name=reply.baseline,
    )
