"""The benchmarker: statistics, interleaved timing, and the cheats only timing can expose.

These tests time things but assert no performance figure; performance lives in bench/.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from actors.roles.benchmarker import _abandoned_on_cancel
from gpu_workers.benchmarking import (
    ROOFLINE_SLACK,
    BenchmarkRequest,
    Measured,
    TimingSession,
    _result,
    benchmark,
    find_stall,
    roofline_ns,
    timing_stats,
)
from gpu_workers.cpu.backend import BENCH_LIMITS, CpuBackend
from gpu_workers.cpu.calibrate import load_or_calibrate
from gpu_workers.cpu.protocol import BASELINE_EVERY_WITH_INCUMBENT
from gpu_workers.protocols import JudgedCall, TimingRequest, TimingRun
from gpu_workers.recheck_pool import SETS
from gpu_workers.results import BenchmarkResult, HostCalibration, Rejection
from gpu_workers.stopping import LOSS_ROUNDS, MIN_RUNS, MIN_SECONDS
from kernels.builtin import BUILTIN
from kernels.spec import Cost
from tests.cpu_support import EXAMPLES, FLAGS, calibration, cpu_backend, kf_cache, planted

__all__ = ["calibration", "cpu_backend", "kf_cache"]
SMALL = {"rows": 64, "cols": 1000}


def test_timing_stats_are_median_and_iqr() -> None:
    stats = timing_stats([5, 1, 4, 2, 3, 100])
    assert stats.median_ns == 3.5
    assert stats.q1_ns == 2.25 and stats.q3_ns == 4.75
    assert stats.iqr_ns == 2.5
    assert (stats.min_ns, stats.max_ns, stats.runs) == (1, 100, 6)
    with pytest.raises(ValueError):
        timing_stats([])


def test_roofline_is_the_slower_of_memory_and_compute(calibration: HostCalibration) -> None:
    memory_bound = Cost(bytes_moved=10**9, flops=1)
    compute_bound = Cost(bytes_moved=1, flops=10**12)
    assert roofline_ns(memory_bound, calibration) == pytest.approx(
        1e9 / calibration.memory_bandwidth_gbs
    )
    assert roofline_ns(compute_bound, calibration) == pytest.approx(
        1e12 / calibration.peak_fp32_gflops
    )


def test_a_stall_is_a_call_far_beyond_the_median() -> None:
    steady = TimingRun(kernel_ns=[1_000_000] * 40, kernel_warmup_ns=[1_500_000] * 3)
    assert find_stall(steady) is None
    stalled = TimingRun(kernel_ns=[1_000_000] * 40, kernel_warmup_ns=[190_000_000, 1_000_000])
    evidence = find_stall(stalled)
    assert evidence is not None and evidence["call"] == "0"
    small_but_relative = TimingRun(kernel_ns=[1_000] * 40, kernel_warmup_ns=[50_000_000])
    assert find_stall(small_but_relative) is None  # 50 ms over: a busy host, not a stall


def _build(backend: CpuBackend, source: str, problem: str = "softmax") -> object:
    """Compiled but not statically checked: the stateful planted kernels below are refused
    by the static stage, and are timed anyway to show that timing catches them too."""
    compiled = backend.compile(BUILTIN[problem], source, FLAGS)
    assert compiled.build is not None, compiled.rejection
    return compiled.build


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("sleeps_first_call", "softmax"),
        ("stops_after_warmup", "softmax"),
        ("memoizes_matmul", "matmul"),
    ],
)
def test_the_static_stage_refuses_the_state_that_timing_cheats_need(
    cpu_backend: CpuBackend, name: str, problem: str
) -> None:
    rejection = cpu_backend.static_check(
        BUILTIN[problem], _build(cpu_backend, planted(name), problem)
    )
    assert rejection is not None
    assert (rejection.stage, rejection.reason) == ("static", "kernel_state")
    assert "(.bss," in rejection.evidence["static_storage"]


def test_every_timed_call_starts_from_poisoned_outputs(
    cpu_backend: CpuBackend, calibration: HostCalibration
) -> None:
    """Neither the kernel's earlier calls nor the incumbent leave it an answer to find."""
    kernel = _build(cpu_backend, planted("crashes_if_output_already_written"))
    assert cpu_backend.static_check(BUILTIN["softmax"], kernel) is None
    incumbent = _build(cpu_backend, (EXAMPLES / "softmax.c").read_text())
    result = benchmark(
        BenchmarkRequest(
            BUILTIN["softmax"], cpu_backend, kernel, calibration, incumbent=incumbent, shape=SMALL
        )
    )
    assert isinstance(result, BenchmarkResult), result
    assert result.kernel.runs >= LOSS_ROUNDS and result.incumbent is not None


def test_a_correct_kernel_is_timed_interleaved_with_baseline_and_incumbent(
    cpu_backend: CpuBackend, calibration: HostCalibration, tmp_path: Path
) -> None:
    kernel = _build(cpu_backend, (EXAMPLES / "softmax.c").read_text())
    incumbent = _build(cpu_backend, planted("tail_off_by_one").replace("cols - 1", "cols"))
    result = benchmark(
        BenchmarkRequest(
            BUILTIN["softmax"],
            cpu_backend,
            kernel,
            calibration,
            incumbent=incumbent,
            shape=SMALL,
            recalibrate=lambda: load_or_calibrate(tmp_path, force=True),  # not the shared cache
        )
    )
    assert isinstance(result, BenchmarkResult), result
    assert result.kernel.runs >= MIN_RUNS
    assert result.timed_seconds >= MIN_SECONDS
    every = BASELINE_EVERY_WITH_INCUMBENT  # the campaign pools the baseline
    assert result.baseline.runs == -(-result.kernel.runs // every)
    assert result.head_to_head is not None and result.head_to_head.rounds >= MIN_RUNS
    assert result.incumbent is not None
    assert abs(result.incumbent.runs - result.kernel.runs) <= 1
    assert result.kernel.q1_ns <= result.kernel.median_ns <= result.kernel.q3_ns
    assert result.speedup == pytest.approx(result.baseline.mean_ns / result.kernel.mean_ns)
    assert result.speedup_vs_incumbent is not None
    assert 0 < result.roofline_fraction <= 1.10, (result, calibration)
    assert result.host_contention_cores is not None and result.host_contention_cores >= 0
    assert result.caches_flushed
    assert result.input_sets == 2
    assert result.rotated_bytes == 2 * BUILTIN["softmax"].nbytes(SMALL)


def test_a_host_with_a_large_cache_times_over_two_flushed_input_sets_too(
    kf_cache: Path, calibration: HostCalibration
) -> None:
    """Every call's inputs and outputs are flushed from the caches before it, so however
    large the last-level cache (here a calibration claims 4 GiB), two input sets do: no
    arena outgrows the driver's file limit (the kernel's, 1 MiB here, plus the arena),
    and no small shape asks for more guarded buffers than a process may map."""
    tight = msgspec.structs.replace(BENCH_LIMITS, file_size_bytes=1 << 20)
    backend = CpuBackend(cache_dir=kf_cache / "cpu-kernels", bench_limits=tight)
    kernel = _build(backend, (EXAMPLES / "softmax.c").read_text())
    huge_cache = msgspec.structs.replace(calibration, llc_bytes=4 << 30)
    for shape in (SMALL, {"rows": 4, "cols": 64}):
        result = benchmark(
            BenchmarkRequest(BUILTIN["softmax"], backend, kernel, huge_cache, shape=shape)
        )
        assert isinstance(result, BenchmarkResult), result
        assert result.caches_flushed
        assert result.input_sets == 2
        assert result.rotated_bytes == 2 * BUILTIN["softmax"].nbytes(shape)


def test_a_first_call_stall_is_rejected(
    cpu_backend: CpuBackend, calibration: HostCalibration
) -> None:
    kernel = _build(cpu_backend, planted("sleeps_first_call"))
    result = benchmark(
        BenchmarkRequest(BUILTIN["softmax"], cpu_backend, kernel, calibration, shape=SMALL)
    )
    assert isinstance(result, Rejection)
    assert (result.stage, result.reason) == ("benchmark", "timing_stall")
    assert result.evidence["call"] == "0" and result.evidence["first_run_call"] == "0"


def test_a_kernel_that_stops_working_after_verification_fails_the_recheck(
    cpu_backend: CpuBackend, calibration: HostCalibration
) -> None:
    kernel = _build(cpu_backend, planted("stops_after_warmup"))
    result = benchmark(
        BenchmarkRequest(BUILTIN["softmax"], cpu_backend, kernel, calibration, shape=SMALL)
    )
    assert isinstance(result, Rejection)
    assert (result.stage, result.reason) == ("recheck", "unwritten")


def test_the_recheck_pool_keeps_its_references_and_still_catches_a_wrong_kernel(
    kf_cache: Path, calibration: HostCalibration
) -> None:
    backend = CpuBackend(cache_dir=kf_cache / "cpu-kernels", recheck_pool=True)
    assert backend.recheck_pool is not None
    pool = backend.recheck_pool.folder
    softmax = BUILTIN["softmax"]
    good = _build(backend, (EXAMPLES / "softmax.c").read_text())
    result = benchmark(BenchmarkRequest(softmax, backend, good, calibration, shape=SMALL))
    assert isinstance(result, BenchmarkResult), result
    assert result.rechecked == softmax.distributions
    sets = {p.parent: p.stat().st_mtime_ns for p in pool.rglob("seed")}
    per_distribution = {folder.parent.name for folder in sets}
    assert per_distribution == set(softmax.distributions)
    assert len(sets) <= SETS * len(softmax.distributions)
    assert pool.stat().st_mode & 0o077 == 0  # private to the worker
    # each set keeps its pass band, not its float64 reference: later kernels are judged
    # in float32 (`pass_band`), and the reference is made again only for one outside it
    assert all(list(folder.glob("band-lo-*.npy")) for folder in sets)
    assert not list(pool.rglob("expected-*.npy"))
    # right on the timed (normal) inputs, wrong only on the pool's nonfinite sets
    bad = _build(backend, planted("evidence_ignores_nan"))
    rejected = benchmark(BenchmarkRequest(softmax, backend, bad, calibration, shape=SMALL))
    assert isinstance(rejected, Rejection)
    assert (rejected.stage, rejected.reason) == ("recheck", "lost_non_finite")
    assert "nonfinite inputs" in rejected.evidence["when"]
    # the sets drawn before were reused as they were, references and all
    assert all((f / "seed").stat().st_mtime_ns == stamp for f, stamp in sets.items())
    backend.recheck_pool.close()
    assert not pool.exists()


SLOW_SOFTMAX = """
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int repeat = 0; repeat < 40; ++repeat)
        for (int64_t r = 0; r < rows; ++r) {
            const float *xr = x + r * cols;
            float *yr = y + r * cols;
            float m = xr[0], s = 0.0f;
            for (int64_t j = 1; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
            for (int64_t j = 0; j < cols; ++j) s += expf(xr[j] - m);
            for (int64_t j = 0; j < cols; ++j) yr[j] = expf(xr[j] - m) / s;
        }
}
"""


def test_a_kernel_that_loses_every_early_round_is_timed_no_further(
    cpu_backend: CpuBackend, calibration: HostCalibration
) -> None:
    """A right kernel forty times slower than the incumbent: the head-to-head ends after
    the rounds that decide it (the first 8 when it lost each by 1.25x; the minimum of 10,
    slower on average beyond chance, when a stall of the incumbent on a busy host spoiled
    one of them), and it is still
    re-checked before its time counts."""
    kernel = _build(cpu_backend, SLOW_SOFTMAX)
    incumbent = _build(cpu_backend, (EXAMPLES / "softmax.c").read_text())
    result = benchmark(
        BenchmarkRequest(
            BUILTIN["softmax"],
            cpu_backend,
            kernel,
            calibration,
            incumbent=incumbent,
            shape=SMALL,
            min_seconds=0.0,
        )
    )
    assert isinstance(result, BenchmarkResult), result
    assert result.head_to_head is not None and not result.head_to_head.faster
    assert result.head_to_head.rounds == result.kernel.runs
    assert LOSS_ROUNDS <= result.kernel.runs <= MIN_RUNS
    assert result.incumbent is not None and result.incumbent.runs == result.kernel.runs
    assert len(result.rechecked) == len(BUILTIN["softmax"].distributions)
    assert len(result.judged_calls) == 3


def test_memoizing_never_pays_since_every_timed_call_has_fresh_inputs(
    cpu_backend: CpuBackend, calibration: HostCalibration
) -> None:
    """A kernel that copies a stored product when it sees the same buffers and sampled
    values again would be faster than the arithmetic allows; here it never sees them."""
    kernel = _build(cpu_backend, planted("memoizes_matmul"), "matmul")
    shape = {"M": 256, "N": 256, "K": 256}
    result = benchmark(
        BenchmarkRequest(BUILTIN["matmul"], cpu_backend, kernel, calibration, shape=shape)
    )
    assert isinstance(result, BenchmarkResult), result
    assert result.roofline_fraction <= ROOFLINE_SLACK


def test_a_crash_during_timing_is_a_rejection(
    cpu_backend: CpuBackend, calibration: HostCalibration
) -> None:
    kernel = _build(cpu_backend, planted("segfaults"))
    result = benchmark(
        BenchmarkRequest(BUILTIN["softmax"], cpu_backend, kernel, calibration, shape=SMALL)
    )
    assert isinstance(result, Rejection)
    assert (result.stage, result.reason) == ("benchmark", "crashed")


class ScriptedTiming:
    """A timing back end that returns prepared runs, each with right outputs: the
    benchmarker's decisions (retries, recalibration) without a kernel behind them."""

    target = "cpu"

    def __init__(
        self, problem_name: str, runs: list[tuple[float, float]], log: list[str] | None = None
    ) -> None:
        self.problem = BUILTIN[problem_name]
        self.script = list(runs)  # (median ns, host contention cores) per run
        self.calls = 0
        self.log = [] if log is None else log
        self.requests: list[TimingRequest[object]] = []

    def time(self, request: TimingRequest[object]) -> TimingRun:
        self.requests.append(request)
        median_ns, contention = self.script[self.calls]
        recheck_seed = request.recheck_seed
        if request.window_open is not None:
            request.window_open()
        self.log.append(f"timed rounds {self.calls}")
        if request.window_closed is not None:
            request.window_closed()
        self.log.append(f"re-check {self.calls}")
        self.calls += 1
        inputs = self.problem.generate(request.shape, "normal", recheck_seed, "fp32")
        right = {k: v.astype(np.float32) for k, v in self.problem.expected(inputs).items()}
        judged = JudgedCall(
            when="a re-check",
            inputs=inputs,
            outputs=right,
            inputs_after=inputs,
            poison_bits=0x7FBADBAD,
            seed=recheck_seed,
        )
        return TimingRun(
            kernel_ns=[int(median_ns)] * MIN_RUNS,
            kernel_warmup_ns=[int(median_ns)] * 3,
            baseline_ns=[int(10 * median_ns)] * MIN_RUNS,
            judged=[judged],
            wall_seconds=10.0,
            timed_seconds=1.0,
            host_contention_cores=contention,
        )


def test_a_busy_host_is_timed_again_and_the_quietest_run_kept(
    calibration: HostCalibration,
) -> None:
    floor = roofline_ns(BUILTIN["softmax"].cost_for(SMALL, "fp32"), calibration)
    backend = ScriptedTiming("softmax", [(10 * floor, 1.5), (12 * floor, 0.1)])
    result = benchmark(
        BenchmarkRequest(BUILTIN["softmax"], backend, None, calibration, shape=SMALL)
    )
    assert isinstance(result, BenchmarkResult), result
    assert backend.calls == 2 and result.timing_attempts == 2
    assert result.host_contention_cores == 0.1
    assert result.kernel.median_ns == int(12 * floor)


def test_every_timing_attempt_has_a_fresh_seed_and_the_result_records_each(
    calibration: HostCalibration,
) -> None:
    """Issue 33, class 3: a busy host's or a stall's repeat drew the same inputs and the
    same judged calls again. Each run now has a seed of its own, recorded in the result."""
    floor = roofline_ns(BUILTIN["softmax"].cost_for(SMALL, "fp32"), calibration)
    backend = ScriptedTiming("softmax", [(10 * floor, 1.5), (10 * floor, 1.5), (12 * floor, 0.1)])
    result = benchmark(
        BenchmarkRequest(BUILTIN["softmax"], backend, None, calibration, shape=SMALL, seed=7)
    )
    assert isinstance(result, BenchmarkResult), result
    seeds = [r.seed for r in backend.requests]
    assert len(seeds) == 3 and len(set(seeds)) == 3
    assert len({r.seeds for r in backend.requests}) == 3  # new inputs every run
    assert result.seed == 7 and result.attempt_seeds == tuple(seeds)


def test_work_shifted_between_calls_earns_no_speedup(calibration: HostCalibration) -> None:
    """Issue 33, class 2: heavy, light, light calls (the same total work) read as the light
    calls' time under a median: 1.7x for nothing. The speedup and the head-to-head are
    figures over all the timed calls, which moving work between them cannot lower."""
    even = [30_000_000] * 30  # well above any host's roofline at the default shape
    shifted = [60_000_000, 15_000_000, 15_000_000] * 10
    baseline = [300_000_000] * 30

    def result(kernel_ns: list[int]) -> BenchmarkResult:
        run = TimingRun(
            kernel_ns=kernel_ns, baseline_ns=baseline, incumbent_ns=even, wall_seconds=1.0
        )
        session = TimingSession(
            BenchmarkRequest(BUILTIN["softmax"], ScriptedTiming("softmax", []), None, calibration)
        )
        return _result(session, Measured(run=run, rechecked=[]))

    honest, shifter = result(even), result(shifted)
    assert shifter.kernel.median_ns < honest.kernel.median_ns  # the median is fooled
    assert shifter.speedup == pytest.approx(honest.speedup)
    assert shifter.speedup_vs_incumbent == pytest.approx(1.0)
    assert shifter.head_to_head is not None and not shifter.head_to_head.faster
    assert shifter.head_to_head.wins == 20  # it won two rounds in three, and still is not


def test_a_run_beyond_the_roofline_recalibrates_once_then_is_refused(
    calibration: HostCalibration,
) -> None:
    floor = roofline_ns(BUILTIN["softmax"].cost_for(SMALL, "fp32"), calibration)
    backend = ScriptedTiming("softmax", [(10 * floor, 1.5), (floor / 3, 1.0), (floor / 3, 1.0)])
    recalibrations = []

    def recalibrate() -> HostCalibration:
        recalibrations.append(1)
        return calibration

    result = benchmark(
        BenchmarkRequest(
            BUILTIN["softmax"], backend, None, calibration, shape=SMALL, recalibrate=recalibrate
        )
    )
    assert isinstance(result, Rejection)
    assert (result.stage, result.reason) == ("roofline", "beyond_roofline")
    assert backend.calls == 2 and len(recalibrations) == 1


class RecordingWindow:
    """A timing window that says when it was opened and closed."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.held = False

    def open(self) -> None:
        if not self.held:
            self.log.append("open")
            self.held = True

    def close(self) -> None:
        if self.held:
            self.log.append("close")
            self.held = False


def test_each_timing_run_and_calibration_holds_the_device_only_for_its_timed_window(
    calibration: HostCalibration,
) -> None:
    """The run's judging and re-check happen after the window closed; a repeated run and a
    calibration each wait for a window of their own."""
    floor = roofline_ns(BUILTIN["softmax"].cost_for(SMALL, "fp32"), calibration)
    log: list[str] = []
    window = RecordingWindow(log)
    backend = ScriptedTiming("softmax", [(10 * floor, 1.5), (floor / 3, 0.1)], log)

    def recalibrate() -> HostCalibration:
        assert window.held
        log.append("calibrate")
        return calibration

    result = benchmark(
        BenchmarkRequest(
            BUILTIN["softmax"],
            backend,
            None,
            calibration,
            shape=SMALL,
            recalibrate=recalibrate,
            window=window,
        )
    )
    assert isinstance(result, Rejection) and result.reason == "beyond_roofline"
    assert log == [
        "open",
        "timed rounds 0",
        "close",
        "re-check 0",
        "open",  # the busy host's second run
        "timed rounds 1",
        "close",
        "re-check 1",
        "open",
        "calibrate",
        "close",
    ]
    assert not window.held


def _running_drivers() -> list[int]:
    """This process's children that run the CPU driver."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if parent == os.getpid() and b"gpu_workers.cpu.runner" in command:
            found.append(int(stat.parent.name))
    return found


def test_the_cpu_driver_holds_the_window_only_from_its_set_up_to_its_timed_rounds_end(
    cpu_backend: CpuBackend, calibration: HostCalibration
) -> None:
    """Verification may share the device during the set-up and the re-check, not during
    timing: the window opens once the driver has loaded the kernels and written their
    inputs, and closes while the driver still runs, once, after the timed rounds."""
    log: list[str] = []
    drivers_at_open: list[list[int]] = []
    drivers_at_close: list[list[int]] = []

    class Window(RecordingWindow):
        def open(self) -> None:
            if not self.held:
                drivers_at_open.append(_running_drivers())
            super().open()

        def close(self) -> None:
            if self.held:
                drivers_at_close.append(_running_drivers())
            super().close()

    window = Window(log)
    kernel = _build(cpu_backend, (EXAMPLES / "softmax.c").read_text())
    shape = {"rows": 512, "cols": 2048}  # a re-check long enough to be seen running
    result = benchmark(
        BenchmarkRequest(
            BUILTIN["softmax"], cpu_backend, kernel, calibration, shape=shape, window=window
        )
    )
    assert isinstance(result, BenchmarkResult), result
    assert log == ["open", "close"] * (len(log) // 2) and log
    assert drivers_at_open[0], "the window opened before the driver had started"
    assert drivers_at_close[0], "the window closed only after the driver had ended"
    assert len(result.rechecked) == len(BUILTIN["softmax"].distributions)
    assert result.host_contention_cores is not None and result.host_contention_cores >= 0


def test_a_run_given_up_when_its_window_opens_leaves_no_driver_behind(
    cpu_backend: CpuBackend, calibration: HostCalibration
) -> None:
    """The benchmarker gives a run up when the best changed while it waited for the window
    (the window's hook raises): the driver, set up and waiting, is killed, and the raise
    reaches the caller."""
    waiting: list[str] = []

    class Window(RecordingWindow):
        def open(self) -> None:
            [driver] = _running_drivers()
            waiting.append((Path(f"/proc/{driver}/cwd") / "progress.txt").read_text())
            raise RuntimeError("the best changed")

    kernel = _build(cpu_backend, (EXAMPLES / "softmax.c").read_text())
    with pytest.raises(RuntimeError, match="the best changed"):
        benchmark(
            BenchmarkRequest(
                BUILTIN["softmax"], cpu_backend, kernel, calibration, shape=SMALL, window=Window([])
            )
        )
    assert waiting == ["waiting for the timed window"]
    assert _running_drivers() == []


@pytest.mark.asyncio
async def test_a_timing_thread_given_up_by_two_cancels_leaves_no_unretrieved_exception() -> None:
    """Issue 35: a SIGINT while timing printed "Task exception was never retrieved": a
    second cancel ended the wait for the given-up thread before its exception was read."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    release, ended = threading.Event(), threading.Event()

    def thread_that_fails_late() -> None:
        release.wait(30)
        ended.set()
        raise RuntimeError("the run was given up")

    class Windows:
        def abandon(self) -> None:
            release.set()

    timing = asyncio.to_thread(thread_that_fails_late)
    waiting = asyncio.create_task(_abandoned_on_cancel(timing, Windows()))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.sleep(0)
    waiting.cancel()  # the shutdown cancels again
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await asyncio.to_thread(ended.wait, 30)
    for _ in range(5):  # the thread's future, then its task, complete on the loop
        await asyncio.sleep(0.01)
    gc.collect()
    assert not [c for c in reported if "never retrieved" in str(c.get("message", ""))], reported
