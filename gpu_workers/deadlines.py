"""How long one kernel call may take when it is timed, from the problem's cost and the
kernel's own verification.

Verification runs the kernel on every trial shape and distribution in the sandbox; how
long that took (`Pace.seconds`, the whole run: the driver, the references, every call)
over the work it did (`Pace.work`: the calls' cost, bytes moved plus flops, summed) is a
generous bound on the kernel's time per unit of work. A timed call at a larger shape may
take `SLACK` times that pace over its own work, and never less than `FLOOR_SECONDS`; an
incumbent timed in the same run is allowed `SLACK` times its recorded time too. A call
past its deadline is stopped (its process killed) and the kernel is rejected as
`timeout` at the benchmark stage, the shape named: on the CPU the driver kills the
kernel host (`cpu/kernel_process.py`); on a GPU the runner ends itself, and its worker
kills a runner stuck past the deadline (`cuda/call_clock.py`). Verification itself is
bounded by the back end's verification limits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from gpu_workers.results import Pace, Rejection
from kernels.spec import Problem

#: How many times the verification's pace a timed call may take.
SLACK = 20.0
#: The least any timed call is allowed, in seconds (a loaded host, a cold cache).
FLOOR_SECONDS = 2.0


def work(problem: Problem, shape: Mapping[str, int], dtype: str = "fp32") -> float:
    """One call's work at `shape`: the bytes it must move plus the flops it must do."""
    cost = problem.cost_for(dict(shape), dtype)
    return float(cost.bytes_moved + cost.flops)


def pace_of(
    problem: Problem,
    calls: Iterable[tuple[Mapping[str, int], int]],
    seconds: float,
    dtype: str = "fp32",
) -> Pace:
    """The pace of a verification that made `calls` ((shape, how many) pairs) in `seconds`."""
    total = sum(work(problem, shape, dtype) * count for shape, count in calls)
    return Pace(seconds=seconds, work=max(total, 1.0))


def recorded_pace(evidence: Mapping[str, Any]) -> Pace | None:
    """The pace a KernelVerified recorded in its evidence (None before paces were kept)."""
    try:
        return msgspec.convert(evidence.get("pace"), Pace)
    except msgspec.ValidationError:
        return None


def call_deadline(
    problem: Problem,
    shape: Mapping[str, int],
    pace: Pace,
    dtype: str = "fp32",
    incumbent_ns: float | None = None,
) -> float:
    """Seconds one timed call at `shape` may take (see the module docstring)."""
    kernel = SLACK * pace.seconds * work(problem, shape, dtype) / pace.work
    incumbent = SLACK * incumbent_ns / 1e9 if incumbent_ns is not None else 0.0
    return max(FLOOR_SECONDS, kernel, incumbent)


def at_shape(rejection: Rejection, shape: Mapping[str, int]) -> Rejection:
    """A timing run's rejection; a `timeout` names the shape it was timed at."""
    if rejection.reason != "timeout":
        return rejection
    words = ", ".join(f"{dim}={size}" for dim, size in shape.items())
    return msgspec.structs.replace(
        rejection,
        message=f"{rejection.message} at the timed shape {words}",
        evidence={**rejection.evidence, "shape": words},
    )
