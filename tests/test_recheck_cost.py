"""The re-check at the timed shape: its cost follows the kernel's time, and its calls fall
among the calls every timing run makes, however soon the stopping rule ends it."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_workers.cpu import protocol as p
from gpu_workers.cpu.timing_run import RECHECK_SECONDS, InterleavedRecheck, recheck_count
from gpu_workers.stopping import LOSS_ROUNDS
from kernels.builtin import BUILTIN

SOFTMAX = BUILTIN["softmax"]
SHAPE = {"rows": 4, "cols": 16}


def _job(min_runs: int = 30, warmup: int = 3) -> p.BenchJob:
    host = p.KernelHostJob(host="-", address_space_bytes=1 << 30, cpu_seconds=10, wall_seconds=10)
    return p.BenchJob(
        library="-",
        incumbent_library=None,
        kernel_host=host,
        fresh_inputs_library=None,
        cache_flush_library="-",
        problem="softmax",
        dtype="fp32",
        shape=SHAPE,
        seed=1,
        seeds=[2, 3],
        recheck_seed=4,
        min_runs=min_runs,
        warmup=warmup,
    )


def test_a_fast_kernel_is_rechecked_on_every_distribution() -> None:
    assert recheck_count(9, 1e-6) == 9
    assert recheck_count(9, RECHECK_SECONDS / 9) == 9


def test_a_slower_kernel_is_rechecked_on_as_many_as_its_calls_fit() -> None:
    assert recheck_count(9, RECHECK_SECONDS / 4) == 4
    assert recheck_count(9, 0.3 * RECHECK_SECONDS) == 3


def test_even_the_slowest_kernel_is_rechecked_once() -> None:
    assert recheck_count(9, 100 * RECHECK_SECONDS) == 1
    assert recheck_count(0, 1.0) == 0


@pytest.mark.parametrize("seed", range(20))
def test_the_recheck_calls_fall_among_the_calls_every_run_makes(seed: int) -> None:
    """A run stopped as lost has `warmup + LOSS_ROUNDS` kernel calls; every re-check call
    comes before one of them (after the first, whose time sets the count), even when the
    minimum of rounds is 30."""
    job = _job(min_runs=30)
    recheck = InterleavedRecheck(SOFTMAX, job, np.random.default_rng(seed))
    positions = sorted(recheck.due)
    assert len(positions) == len(SOFTMAX.distributions)
    assert positions[0] >= 1 and positions[-1] < job.warmup + LOSS_ROUNDS


@pytest.mark.parametrize(("call_seconds", "kept"), [(1e-4, 9), (RECHECK_SECONDS / 3, 3), (5, 1)])
def test_the_first_calls_time_sets_how_many_distributions_are_rechecked(
    call_seconds: float, kept: int
) -> None:
    recheck = InterleavedRecheck(SOFTMAX, _job(), np.random.default_rng(7))
    recheck.after_first_call(int(call_seconds * 1e9))
    assert len(recheck.selected) == kept
    assert len(recheck.prepared) == kept  # the only calls made among the timed ones
    assert set(recheck.selected) <= set(SOFTMAX.distributions)
    assert sorted(d for d, _ in recheck.prepared.values()) == sorted(recheck.selected)
