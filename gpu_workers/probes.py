"""What an agent may run on its own draft kernel before it submits it: the compile and
static stages (`verification.precheck`, exactly the compiler's and the verifier's first
stages), verification at the problem's smallest test shapes (the rules of
`verification.verify`, in the sandbox) and a few timed calls at one shape through the back
end's own timing run (fresh inputs, caches flushed, its judged calls checked).

Their figures are advice to the agent, never evidence: the verifier and the benchmarker
judge every submitted kernel again from the start. Each runs on a back end of its own
(`probe_backend`) whose every sandboxed run stays within `PROBE_LIMITS`, so a draft that
spins ends soon.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from gpu_workers.protocols import Backend, TimingRequest
from gpu_workers.results import Rejection, Verdict
from gpu_workers.sandbox import Limits
from gpu_workers.targets import target_of
from gpu_workers.verification import new_seed, precheck, trial_seed, verify
from kernels.spec import Problem

SMALL_SHAPES = 3
"""The smallest test shapes a quick verification runs."""
QUICK_RUNS = 5
"""Timed calls of a quick timing (after the back end's warm-up)."""
PROBE_LIMITS = Limits(
    cpu_seconds=60, address_space_bytes=4 << 30, wall_seconds=30.0, file_size_bytes=256 << 20
)
"""What a draft may use over one probe (verification or timing)."""
ROTATE_BYTES = 512 * 1024 * 1024
"""Written between calls by a back end that cannot flush its caches (the cpu back end
flushes them and ignores it): more than any last-level cache of today."""


@dataclass(frozen=True)
class QuickTime:
    """A quick timing: the kernel's median and the baseline's, in ns, over `runs` calls."""

    median_ns: float
    baseline_ns: float
    runs: int
    shape: dict[str, int]


def probe_backend(target: str) -> Backend[Any]:
    """A back end of `target` for probes, within `PROBE_LIMITS`."""
    return target_of(target).probing_backend(PROBE_LIMITS)


def probe_compile(
    problem: Problem, backend: Backend[Any], source: str, flags: tuple[str, ...], dtype: str
) -> Rejection | None:
    """The compile and static stages: None when both pass, else why not."""
    return precheck(problem, backend, source, flags, dtype).rejection


def probe_verify(
    problem: Problem, backend: Backend[Any], source: str, flags: tuple[str, ...], dtype: str
) -> Verdict:
    """Verification at the `SMALL_SHAPES` smallest test shapes, with a fresh seed."""
    return verify(problem, backend, source, flags, dtype=dtype, smallest=SMALL_SHAPES)


def probe_time(
    problem: Problem,
    backend: Backend[Any],
    source: str,
    flags: tuple[str, ...],
    dtype: str,
    shape: dict[str, int] | None,
) -> QuickTime | Rejection:
    """`QUICK_RUNS` timed calls at `shape` (None: the problem's default) against the
    baseline, in one timing run; a kernel that does not build, or whose judged calls are
    wrong, is the rejection."""
    compiled = precheck(problem, backend, source, flags, dtype)
    if compiled.build is None:
        assert compiled.rejection is not None
        return compiled.rejection
    full = problem.full_shape(shape or problem.default_shape)
    seed = new_seed()
    run = backend.time(
        TimingRequest(
            problem=problem,
            build=compiled.build,
            incumbent=None,
            shape=full,
            seed=seed,
            seeds=(trial_seed(seed, 0, "bench"),),
            recheck_seed=None,
            rotate_bytes=ROTATE_BYTES,
            min_runs=QUICK_RUNS,
            min_seconds=0.0,
            half_width=None,  # a fixed count: advice, never evidence
        )
    )
    if run.rejection is not None:
        return run.rejection
    if not run.kernel_ns or not run.baseline_ns:
        return Rejection(
            stage="benchmark", reason="no_samples", message="the timing run gave no samples"
        )
    return QuickTime(
        median_ns=float(statistics.median(run.kernel_ns)),
        baseline_ns=float(statistics.median(run.baseline_ns)),
        runs=len(run.kernel_ns),
        shape=dict(full),
    )
