"""The final run's rules, the same for every device: a campaign's top kernels built by the
target's back end and timed together in one interleaved run (the head-to-head extended to
N contenders, `protocols.FinalRequest`), bounded in time, and what it comes to: each
contender's statistics over its timed calls, and the order by mean (the ranking figure,
which moving work between calls cannot lower). A contender whose judged calls failed in
the run keeps its statistics but is left out of the order, with its reason.

Timing stops after `FINAL_ROUNDS` (60) rounds, or once `final_seconds` have passed with
at least 3: `FINAL_SECONDS` (8 s), or `MIN_FINAL_ROUNDS` (8) rounds at the contenders'
recorded times where that is longer, so a campaign that ends on its wall time still ends
within seconds. The run is made once per campaign and decides its answer among kernels
a few percent apart, so it gets more rounds than a candidate's timing run (at softmax
4096x4096 on two cores, 3 s held 16 rounds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic

from gpu_workers.benchmarking import DISTINCT_INPUT_SETS, NoWindow, timing_stats
from gpu_workers.deadlines import at_shape
from gpu_workers.protocols import Backend, BuildT, FinalRequest, TimingWindow
from gpu_workers.results import Rejection, TimingStats
from gpu_workers.targets import backend_for
from gpu_workers.verification import new_seed, trial_seed
from kernels.spec import Problem

FINAL_ROUNDS = 60
FINAL_SECONDS = 8.0
MIN_FINAL_ROUNDS = 8


def final_seconds(recorded_ns: Sequence[float]) -> float:
    """How long a final run's timed rounds may take: `FINAL_SECONDS`, or `MIN_FINAL_ROUNDS`
    rounds at the contenders' recorded times where that is longer."""
    return max(FINAL_SECONDS, MIN_FINAL_ROUNDS * sum(recorded_ns) / 1e9)


@dataclass(frozen=True)
class Standing:
    """One contender in the final run: its timed calls' statistics, and why it failed its
    judged calls (None: it passed)."""

    stats: TimingStats
    failure: Rejection | None


@dataclass(frozen=True)
class FinalResult:
    standings: list[Standing]
    """In the request's order."""
    order: list[int]
    """The passing contenders' indices, fastest mean first."""
    baseline: TimingStats | None
    baseline_name: str
    rounds: int
    timed_seconds: float
    host_contention_cores: float | None
    seed: int
    shape: dict[str, int]


def ranked(standings: Sequence[Standing]) -> list[int]:
    """The indices of the contenders that passed, by mean time, fastest first."""
    passed = [n for n, s in enumerate(standings) if s.failure is None]
    return sorted(passed, key=lambda n: standings[n].stats.mean_ns)


@dataclass(frozen=True)
class FinalBuilds(Generic[BuildT]):
    """The contenders built by one back end, ready for a final run there."""

    backend: Backend[BuildT]
    builds: tuple[BuildT, ...]

    def time(
        self,
        problem: Problem,
        shape: dict[str, int],
        *,
        llc_bytes: int,
        max_seconds: float,
        rounds: int = FINAL_ROUNDS,
        seed: int | None = None,
        window: TimingWindow | None = None,
        watch: Callable[[], None] | None = None,
        call_seconds: float | None = None,
    ) -> FinalResult | Rejection:
        """Time every contender in one interleaved run; a run the back end could not make
        (one it does not support, a kernel that crashed) is the rejection it gave."""
        seed = new_seed() if seed is None else seed
        window = window or NoWindow()
        try:
            samples = self.backend.time_final(
                FinalRequest(
                    problem=problem,
                    builds=self.builds,
                    shape=shape,
                    seed=seed,
                    seeds=tuple(trial_seed(seed, i, "final") for i in range(DISTINCT_INPUT_SETS)),
                    rounds=rounds,
                    max_seconds=max_seconds,
                    rotate_bytes=2 * llc_bytes,
                    window_open=window.open,
                    window_closed=window.close,
                    watch=watch,
                    call_seconds=call_seconds,
                )
            )
        finally:
            window.close()
        if samples.rejection is not None:
            return at_shape(samples.rejection, shape)
        if any(not ns for ns in samples.contender_ns):
            return Rejection(
                stage="benchmark",
                reason="final_run_incomplete",
                message="a contender of the final run has no timed calls",
            )
        standings = [
            Standing(timing_stats(ns), failure)
            for ns, failure in zip(samples.contender_ns, samples.failures, strict=True)
        ]
        return FinalResult(
            standings=standings,
            order=ranked(standings),
            baseline=timing_stats(samples.baseline_ns) if samples.baseline_ns else None,
            baseline_name=samples.baseline_name,
            rounds=samples.rounds,
            timed_seconds=samples.timed_seconds,
            host_contention_cores=samples.host_contention_cores,
            seed=seed,
            shape=shape,
        )


def build_contenders(
    target: str, problem: Problem, kernels: Sequence[tuple[str, tuple[str, ...]]], dtype: str
) -> FinalBuilds[Any] | Rejection:
    """Build every contender (source, flags) with the target's back end; the first that
    does not build (it did before, so the toolchain changed) is the compile stage's
    rejection."""
    backend = backend_for(target)
    builds = []
    for source, flags in kernels:
        compiled = backend.compile(problem, source, flags, dtype)
        if compiled.build is None:
            assert compiled.rejection is not None
            return compiled.rejection
        builds.append(compiled.build)
    return FinalBuilds(backend, tuple(builds))
