"""Fresh inputs before every timed CUDA call and random judged calls (gpu_workers.cuda.fresh,
the runner's timing path, the back end's reading of its reply).

Without a GPU: the choice of judged calls from the secret seed, the keys and the host
replica of the refresh kernel, the refresh kernel's build, the reply and its arrays read
back, and the TimingRun made of them. On a GPU: planted kernels that memoize by pointer or
are wrong on odd calls are caught, and the seed comes back and replays the run.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np
import pytest

from gpu_workers import runner_files as files
from gpu_workers.benchmarking import judge_calls
from gpu_workers.cuda import fresh
from gpu_workers.cuda import protocol as p
from gpu_workers.cuda import timing as cuda_timing
from gpu_workers.cuda.backend import CudaBackend
from gpu_workers.cuda.device import gpu_unavailable_reason
from gpu_workers.cuda.nvcc import nvcc_identity, nvcc_path
from gpu_workers.cuda.timing import CudaCall, CudaTiming, Recheck
from gpu_workers.results import Rejection, SandboxReport
from gpu_workers.sandbox import SandboxOutcome
from gpu_workers.verification import check_outputs
from kernels.builtin import BUILTIN, GELU

NO_GPU = gpu_unavailable_reason()


def needs_gpu(test: Callable[..., None]) -> Callable[..., None]:
    """Marked `gpu`; skipped with the device probe's reason on a host without one."""
    skip = pytest.mark.skipif(NO_GPU is not None, reason=f"needs a CUDA GPU: {NO_GPU}")
    return pytest.mark.gpu(skip(test))


needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="nvcc is not installed")
PLANTED = Path(__file__).parent / "planted"
KDA = BUILTIN["kda"]


# The secret seed's choices ------------------------------------------------------------------


def test_mix64_is_splitmix64_on_the_host_and_in_arrays() -> None:
    assert fresh.mix64(0) == 0xE220A8397B1DCDAF  # splitmix64's first output from state 0
    values = np.random.default_rng(1).integers(0, 2**63, 1000, dtype=np.uint64)
    values[:3] = [0, 2**63 - 1, 12345]
    assert [int(v) for v in fresh.mix64_array(values)] == [fresh.mix64(int(v)) for v in values]


def test_the_judged_calls_are_a_replayable_choice_of_the_secret_seed() -> None:
    assert fresh.judged_calls(7, 3, 100) == fresh.judged_calls(7, 3, 100)
    assert fresh.judged_calls(7, 3, 100) != fresh.judged_calls(8, 3, 100)
    assert fresh.judged_calls(7, 3, 2) == [0, 1]  # fewer calls than slots: all of them
    choice = fresh.JudgeChoice(7, 3)
    slots = [choice.offer(call) for call in range(100)]
    assert choice.held == fresh.judged_calls(7, 3, 100)
    for slot, call in enumerate(choice.held):
        assert slots[call] == slot  # the call each slot holds was the last kept there
    with pytest.raises(ValueError, match="offered after"):
        choice.offer(5)


def test_every_call_is_as_likely_to_be_judged_late_or_early() -> None:
    """Reservoir sampling: after any number of calls each is held with probability k/T, so
    a kernel right only on its first (or last) calls is caught as often as any."""
    calls, slots, seeds = 40, 3, 6000
    held = Counter(c for seed in range(seeds) for c in fresh.judged_calls(seed, slots, calls))
    expected = seeds * slots / calls  # 450 per call
    assert set(held) == set(range(calls))
    assert all(abs(n - expected) < 0.25 * expected for n in held.values()), held


def test_refresh_keys_differ_per_refresh_array_and_seed() -> None:
    keys = {fresh.refresh_key(seed, n, a) for seed in (1, 2) for n in range(50) for a in range(3)}
    assert len(keys) == 2 * 50 * 3


# The refresh, replicated on the host ----------------------------------------------------------


def _reservoir(problem: object, shape: dict[str, int], name: str, sets: int) -> np.ndarray:
    assert problem is GELU or problem is KDA
    arrays = [problem.generate(shape, "normal", seed, "fp32")[name] for seed in range(sets)]
    return np.stack([p.as_bits(a, "fp32") for a in arrays])


def test_an_elementwise_problem_is_refreshed_element_by_element() -> None:
    shape = {"n": 1000}
    layout = fresh.row_layout(GELU, GELU.args[0], shape, 4)
    assert (layout.rows, layout.row_units) == (1000, 2)
    reservoir = _reservoir(GELU, shape, "x", 2)
    first = fresh.refresh_on_host(reservoir, fresh.refresh_key(9, 0, 0), layout)
    second = fresh.refresh_on_host(reservoir, fresh.refresh_key(9, 1, 0), layout)
    assert first.view(np.uint32).shape == (1000,)
    assert not np.array_equal(first, second)
    values = first.view(np.uint32)
    pool = set(reservoir.reshape(-1).tolist())
    assert set(values.tolist()) <= pool  # every value one the problem generated
    assert len(set(values.tolist())) > 500  # drawn from many places, not one set copied
    again = fresh.refresh_on_host(reservoir, fresh.refresh_key(9, 0, 0), layout)
    assert np.array_equal(first, again)


def test_a_problem_with_its_own_generator_keeps_its_rows() -> None:
    """kda normalises each key row: rows move whole, so every refreshed row is a unit row."""
    shape = dict(min(KDA.test_shapes, key=KDA.nbytes))
    k = next(a for a in KDA.inputs if a.name == "k")
    layout = fresh.row_layout(KDA, k, shape, 4)
    assert layout.row_units == 2 * shape["K"]
    reservoir = _reservoir(KDA, shape, "k", 3)
    out = fresh.refresh_on_host(reservoir, fresh.refresh_key(3, 5, 1), layout)
    rows = out.view(np.float32).reshape(-1, shape["K"]).astype(np.float64)
    assert np.allclose(np.sqrt((rows * rows).sum(axis=1)), 1.0, rtol=1e-5)


def test_two_byte_elements_move_as_units_of_their_own() -> None:
    layout = fresh.row_layout(GELU, GELU.args[0], {"n": 7}, 2)
    assert (layout.rows, layout.row_units, layout.units) == (7, 1, 7)
    assert fresh.row_layout(GELU, GELU.args[0], {"n": 0}, 2).units == 0
    assert fresh.refresh_grid(fresh.RowLayout(rows=1 << 30, row_units=2)) == (1 << 16, 1, 1)
    assert fresh.refresh_grid(fresh.RowLayout(rows=3, row_units=1)) == (1, 1, 1)


@needs_nvcc
def test_the_refresh_kernel_builds_once_per_arch(tmp_path: Path) -> None:
    nvcc = nvcc_path()
    assert nvcc is not None
    cubin = fresh.refresh_cubin(nvcc, nvcc_identity(nvcc), "sm_90", tmp_path)
    assert cubin.is_file() and cubin.stat().st_size > 0
    stamp = cubin.stat().st_mtime_ns
    assert fresh.refresh_cubin(nvcc, nvcc_identity(nvcc), "sm_90", tmp_path) == cubin
    assert cubin.stat().st_mtime_ns == stamp
    assert [c.name for c in (tmp_path / "refresh").iterdir()] == [cubin.name]  # no work dirs


# The reply and the TimingRun ------------------------------------------------------------------


def _reply(judged: list[p.JudgedCall], rechecks: list[p.RecheckJob]) -> p.BenchReply:
    return p.BenchReply(
        kernel_ns=[100, 110, 105],
        kernel_warmup_ns=[300],
        baseline_ns=[200, 210, 205],
        incumbent_ns=[],
        input_sets=2,
        rotated_bytes=4096,
        timed_seconds=0.01,
        baseline="torch",
        l2_flush_bytes=1 << 27,
        cache_policy="flushed",
        secret_seed=424242,
        kernel_calls=4,
        judged=judged,
        rechecks=rechecks,
        input_policy="fresh",
    )


def _outcome() -> SandboxOutcome:
    return SandboxOutcome(
        returncode=0,
        signal_name=None,
        timed_out=False,
        cpu_limit_hit=False,
        wall_seconds=2.0,
        cpu_seconds=1.0,
        other_cpu_seconds=None,
        stdout="",
        stderr="",
        report=SandboxReport(
            network_isolated=False,
            network_note="test",
            cpu_seconds_limit=1200,
            address_space_limit_bytes=-1,
            wall_seconds_limit=600.0,
        ),
    )


SHAPE = {"n": 64}


def _right(distribution: str, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    inputs = GELU.generate(SHAPE, distribution, seed, "fp32")
    expected = GELU.expected(inputs)
    return inputs, {"y": expected["y"].astype(np.float32)}


def test_the_reply_and_its_arrays_are_read_back_as_written(tmp_path: Path) -> None:
    """What the runner leaves in the sandbox dir, decoded as the back end reads it."""
    judged = [p.JudgedCall(slot=0, call=2, timed=True, input_set=0, refresh=4)]
    rechecks = [p.RecheckJob(distribution="normal", seed=11)]
    reply = _reply(judged, rechecks)
    (tmp_path / files.RESULT_FILE).write_bytes(msgspec.json.encode(reply))
    given, wrote = _right("normal", 5)
    np.save(tmp_path / p.judged_in_file(0, "x"), p.as_bits(given["x"], "fp32"))
    np.save(tmp_path / p.judged_after_file(0, "x"), p.as_bits(given["x"] * 2, "fp32"))
    np.save(tmp_path / p.judged_out_file(0, "y"), p.as_bits(wrote["y"], "fp32"))
    np.save(tmp_path / p.recheck_out_file(0, "y"), p.as_bits(wrote["y"], "fp32"))
    np.save(tmp_path / p.recheck_after_file(0, "x"), p.as_bits(given["x"], "fp32"))
    decoded = files.expect_reply(tmp_path, p.Reply, p.BenchReply)
    assert decoded == reply
    timing = cuda_timing.read_timing(GELU, "fp32", tmp_path, decoded, _outcome(), (1, 2))
    assert timing.secret_seed == 424242 and timing.wall_seconds == 2.0
    assert timing.sandbox is not None and timing.sandbox.address_space_limit_bytes == -1
    [call] = timing.judged
    assert call.record.call == 2
    assert np.array_equal(call.inputs["x"], given["x"])
    assert np.array_equal(call.inputs_after["x"], given["x"] * 2)
    assert np.array_equal(call.outputs["y"], wrote["y"])
    [done] = timing.rechecks
    assert (done.distribution, done.seed) == ("normal", 11)
    assert np.array_equal(done.outputs["y"], wrote["y"])
    assert np.array_equal(done.inputs_after["x"], given["x"])


def _timing(*, right: bool = True, inputs_kept: bool = True) -> CudaTiming:
    given, wrote = _right("normal", 5)
    if not right:
        wrote = {"y": given["x"].copy()}  # what a kernel wrong on this call wrote
    after = given if inputs_kept else {"x": np.zeros_like(given["x"])}
    record = p.JudgedCall(slot=0, call=3, timed=True, input_set=1, refresh=6)
    rechecks = cuda_timing.default_rechecks(GELU, 13)
    return CudaTiming(
        reply=_reply([record], [p.RecheckJob(distribution=d, seed=s) for d, s in rechecks]),
        rejection=None,
        secret_seed=424242,
        wall_seconds=2.0,
        poison_bits=p.POISON_BITS["fp32"],
        judged=[CudaCall(record=record, inputs=given, outputs=wrote, inputs_after=after)],
        rechecks=[Recheck(d, s, _right(d, s)[1], _right(d, s)[0]) for d, s in rechecks],
    )


def test_the_timing_run_carries_every_call_the_benchmarker_judges() -> None:
    run = cuda_timing.timing_run(GELU, "fp32", SHAPE, _timing())
    assert run.rejection is None
    assert (run.kernel_ns, run.baseline_ns, run.wall_seconds) == (
        [100, 110, 105],
        [200, 210, 205],
        2.0,
    )
    assert run.judged_calls == [3]
    assert run.rechecked == list(GELU.distributions)
    assert len(run.judged) == 1 + len(GELU.distributions)
    assert "call 3" in run.judged[0].when and "424242" in run.judged[0].when
    assert [c.seed for c in run.judged[1:]] == [
        s for _, s in cuda_timing.default_rechecks(GELU, 13)
    ]
    assert judge_calls(GELU, "fp32", run.judged) is None


def test_a_wrong_judged_call_or_changed_inputs_reject_the_kernel() -> None:
    wrong = cuda_timing.timing_run(GELU, "fp32", SHAPE, _timing(right=False))
    rejection = judge_calls(GELU, "fp32", wrong.judged)
    assert rejection is not None and rejection.stage == "recheck"
    assert "call 3" in rejection.evidence["when"]
    changed = cuda_timing.timing_run(GELU, "fp32", SHAPE, _timing(inputs_kept=False))
    rejection = judge_calls(GELU, "fp32", changed.judged)
    assert rejection is not None and rejection.reason == "input_modified"


def test_a_failed_run_passes_its_rejection_through() -> None:
    failed = dataclasses.replace(
        _timing(),
        reply=None,
        rejection=Rejection(stage="benchmark", reason="crashed", message="boom"),
    )
    run = cuda_timing.timing_run(GELU, "fp32", SHAPE, failed)
    assert run.rejection is not None and run.rejection.reason == "crashed"
    assert run.kernel_ns == [] and run.judged == []


def test_the_rechecks_cover_every_distribution_with_seeds_of_their_own() -> None:
    rechecks = cuda_timing.default_rechecks(GELU, 6)
    assert [d for d, _ in rechecks] == list(GELU.distributions)
    assert len({s for _, s in rechecks}) == len(rechecks)
    assert rechecks == cuda_timing.default_rechecks(GELU, 6)


# On a GPU ------------------------------------------------------------------------------------


GELU_OK = """#include <stdint.h>
// kf-launch: kf_gelu(x, y, n) grid=(cdiv(n, 256)) block=(256)
extern "C" __global__ void kf_gelu(const float *x, float *y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    }
}
"""
RESERVOIR_SEEDS = [21, 22]


def _time(backend: CudaBackend, source: str, shape: dict[str, int], secret_seed: int) -> CudaTiming:
    """A timing run without the static stage (a planted kernel must be caught by timing
    itself), without an incumbent."""
    compiled = backend.compile(GELU, source, (), "fp32")
    assert compiled.build is not None, compiled.rejection
    return backend.timing(
        GELU,
        compiled.build,
        None,
        shape,
        secret_seed=secret_seed,
        seeds=RESERVOIR_SEEDS,
        rechecks=cuda_timing.default_rechecks(GELU, 23),
        rotate_bytes=0,
        min_runs=20,
        min_seconds=0.1,
    )


def _judged_wrong(timing: CudaTiming) -> list[int]:
    """The judged calls whose outputs are wrong for the inputs they were given."""
    tolerance = GELU.tolerances["fp32"]
    return [
        c.record.call
        for c in timing.judged
        if check_outputs(GELU, tolerance, c.inputs, c.outputs, timing.poison_bits[0])[0] is not None
    ]


@needs_gpu
@needs_nvcc
def test_a_kernel_that_memoizes_by_pointer_is_caught_by_fresh_inputs(tmp_path: Path) -> None:
    """Right on its first call per pointer, then stale: with inputs unchanged between calls
    it would pass. The static stage refuses its device globals; timing must not need that."""
    backend = CudaBackend(cache_dir=tmp_path, judged_calls=8)
    source = (PLANTED / "cuda_memoizes_by_pointer.cu").read_text()
    timing = _time(backend, source, {"n": 1 << 16}, secret_seed=101)
    assert timing.rejection is None and timing.reply is not None, timing.rejection
    assert timing.reply.kernel_calls > 2 * 8
    wrong = _judged_wrong(timing)
    assert wrong, "stale memoized outputs passed"
    assert all(call >= 2 for call in wrong)  # its first call on each pool set computes
    run = cuda_timing.timing_run(GELU, "fp32", {"n": 1 << 16}, timing)
    rejection = judge_calls(GELU, "fp32", run.judged)
    assert rejection is not None and rejection.stage == "recheck"


@needs_gpu
@needs_nvcc
def test_a_kernel_wrong_only_on_odd_calls_is_caught_by_random_judged_calls(
    tmp_path: Path,
) -> None:
    backend = CudaBackend(cache_dir=tmp_path, judged_calls=16)
    source = (PLANTED / "cuda_wrong_on_odd_calls.cu").read_text()
    timing = _time(backend, source, {"n": 1 << 16}, secret_seed=202)
    assert timing.rejection is None and timing.reply is not None, timing.rejection
    wrong = _judged_wrong(timing)
    assert wrong  # 16 calls drawn at random: all even has odds 2^-16
    assert wrong == [c.record.call for c in timing.judged if c.record.call % 2 == 1]
    run = cuda_timing.timing_run(GELU, "fp32", {"n": 1 << 16}, timing)
    assert judge_calls(GELU, "fp32", run.judged) is not None


@needs_gpu
@needs_nvcc
def test_the_secret_seed_is_recorded_and_replays_the_judged_calls_and_inputs(
    tmp_path: Path,
) -> None:
    backend = CudaBackend(cache_dir=tmp_path, judged_calls=4)
    shape = {"n": 10007}  # no multiple of a block
    timing = _time(backend, GELU_OK, shape, secret_seed=(1 << 63) + 12345)
    assert timing.rejection is None and timing.reply is not None, timing.rejection
    reply = timing.reply
    assert reply.secret_seed == timing.secret_seed == (1 << 63) + 12345
    assert _judged_wrong(timing) == []
    by_slot = sorted(timing.judged, key=lambda c: c.record.slot)
    replayed = fresh.judged_calls(reply.secret_seed, 4, reply.kernel_calls)
    assert [c.record.call for c in by_slot] == replayed
    warm_up = len(reply.kernel_warmup_ns)
    assert reply.kernel_calls == warm_up + len(reply.kernel_ns)
    layout = fresh.row_layout(GELU, GELU.args[0], shape, 4)
    reservoir = np.stack(
        [p.as_bits(GELU.generate(shape, "normal", s, "fp32")["x"], "fp32") for s in RESERVOIR_SEEDS]
    )
    seen = set()
    for call in timing.judged:
        key = fresh.refresh_key(reply.secret_seed, call.record.refresh, 0)
        expected = fresh.refresh_on_host(reservoir, key, layout).view(np.uint32)
        given = p.as_bits(call.inputs["x"], "fp32")
        assert np.array_equal(given, expected), call.record  # the device drew what the host replays
        assert np.array_equal(p.as_bits(call.inputs_after["x"], "fp32"), given)
        assert call.record.timed == (call.record.call >= warm_up)
        seen.add(given.tobytes())
    assert len(seen) == len(timing.judged)  # no two judged calls were given the same inputs
    run = cuda_timing.timing_run(GELU, "fp32", shape, timing)
    assert run.rejection is None and judge_calls(GELU, "fp32", run.judged) is None
    assert run.judged_calls == sorted(replayed)


HOST_REPLAY = """#include <stdio.h>
#include <stdlib.h>
#include "refresh.cu"
int main(int argc, char **argv) {
    uint64_t rows = strtoull(argv[1], 0, 10), row_units = strtoull(argv[2], 0, 10);
    uint64_t sets = strtoull(argv[3], 0, 10), key = strtoull(argv[4], 0, 10);
    for (uint64_t u = 0; u < rows * row_units; ++u)
        printf("%llu\\n", (unsigned long long)kf_refresh_source(u, rows, row_units, sets, key));
    printf("%llu\\n", (unsigned long long)kf_mix64(key));
    return 0;
}
"""


@needs_nvcc
@pytest.mark.parametrize(("rows", "row_units", "sets"), [(37, 2, 2), (5, 128, 3), (11, 1, 1)])
def test_the_refresh_kernels_own_index_math_is_what_the_host_replays(
    tmp_path: Path, rows: int, row_units: int, sets: int
) -> None:
    """refresh.cu's kf_refresh_source and kf_mix64, built for the host by nvcc, against
    fresh.refresh_on_host: the kernel copies what the host replica says it copies."""
    import shutil
    import subprocess

    nvcc = nvcc_path()
    assert nvcc is not None
    shutil.copy(fresh.REFRESH_SOURCE, tmp_path / "refresh.cu")
    (tmp_path / "replay.cu").write_text(HOST_REPLAY)
    subprocess.run([nvcc, "-o", "replay", "replay.cu"], cwd=tmp_path, check=True, timeout=300)
    key = fresh.refresh_key(2**63 + 99, 17, 1)
    done = subprocess.run(
        [str(tmp_path / "replay"), str(rows), str(row_units), str(sets), str(key)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    *sources, mixed = (int(line) for line in done.stdout.split())
    assert mixed == fresh.mix64(key)
    units = rows * row_units
    reservoir = np.arange(sets * units, dtype=np.uint16).reshape(sets, -1)  # unit = its index
    layout = fresh.RowLayout(rows=rows, row_units=row_units)
    replica = fresh.refresh_on_host(reservoir, key, layout)
    assert sources == [int(v) for v in replica]
