"""The verifier: every correct kernel passes; every planted cheat is caught at the right stage."""

from __future__ import annotations

import os
import random
import time

import numpy as np
import pytest

from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.sandbox import Limits
from gpu_workers.targets import target_of
from gpu_workers.verification import (
    check_outputs,
    contract_shapes,
    plan_trials,
    trial_shapes,
    verify,
)
from kernels.builtin import BUILTIN
from kernels.templates import EXAMPLE_TEMPLATES, TEMPLATES, example_file_text
from tests.cpu_support import EXAMPLES, FLAGS, calibration, cpu_backend, kf_cache, planted

__all__ = ["calibration", "cpu_backend", "kf_cache"]


@pytest.mark.parametrize("problem", sorted(BUILTIN))
def test_the_example_kernel_of_every_problem_is_verified(
    problem: str, cpu_backend: CpuBackend
) -> None:
    text = (EXAMPLES / f"{problem}.c").read_text()
    built = example_file_text(problem, target_of("cpu").built_flags)
    assert text == built, "kernels/examples is stale: bench/write_examples.py"
    rendered = TEMPLATES[EXAMPLE_TEMPLATES[problem]].render(
        TEMPLATES[EXAMPLE_TEMPLATES[problem]].best_known
    )
    spec = BUILTIN[problem]
    verdict = verify(spec, cpu_backend, rendered.source, rendered.flags)
    assert verdict.verified, (verdict.seed, verdict.rejection)
    assert verdict.rejection is None
    assert verdict.seed is not None
    shapes = trial_shapes(spec, verdict.seed)
    contract = contract_shapes(spec, verdict.seed)  # once each
    assert len(verdict.trials) == len(shapes) * len(spec.distributions) + len(contract)
    assert {t.distribution for t in verdict.trials} == set(spec.distributions)
    assert verdict.max_rel_err is not None and verdict.max_rel_err < 1e-4
    assert verdict.sandbox is not None


@pytest.mark.slow  # a sweep of template points: about 30 s
def test_random_points_of_every_softmax_and_matmul_space_verify(
    cpu_backend: CpuBackend,
) -> None:
    rng = random.Random(11)
    for name in ("softmax_rows", "matmul_blocked", "matmul_packed"):
        template = TEMPLATES[name]
        for params in rng.sample(list(template.valid_points()), 2):
            rendered = template.render(params)
            verdict = verify(
                BUILTIN[template.problem], cpu_backend, rendered.source, rendered.flags
            )
            assert verdict.verified, (name, params, verdict.seed, verdict.rejection)


def test_trials_cover_every_shape_and_distribution_with_fresh_inputs() -> None:
    spec = BUILTIN["softmax"]
    trials = plan_trials(spec, seed=5)
    shapes = trial_shapes(spec, 5)
    pairs = {(tuple(t.shape.values()), t.distribution) for t in trials}
    contract = contract_shapes(spec, 5)  # once each, on the first distribution
    assert len(pairs) == len(trials) == len(shapes) * len(spec.distributions) + len(contract)
    assert len({t.seed for t in trials}) == len(trials)
    again = plan_trials(spec, seed=6)
    assert trial_shapes(spec, 6) != shapes
    assert not np.array_equal(trials[0].inputs["x"], again[0].inputs["x"])
    # the largest shape is the race-stress shape, stressed on its first distribution
    stressed = [t for t in trials if t.runs > 2]
    assert len(stressed) == 1
    assert spec.nbytes(stressed[0].shape) == max(spec.nbytes(s) for s in shapes)
    assert [t.shape for t in trials if t.runs == 1] == list(contract)


PLANTED = [
    # (file, problem, stage, reasons)
    ("tail_off_by_one", "softmax", "compare", {"wrong_value"}),
    ("first_row_only", "softmax", "compare", {"unwritten"}),
    ("nan_for_large_inputs", "softmax", "compare", {"non_finite"}),
    ("gelu_wrong_for_negatives", "gelu", "compare", {"wrong_value"}),
    ("reads_out_of_bounds", "softmax", "run", {"crashed"}),
    ("writes_past_end", "softmax", "run", {"out_of_bounds_write"}),
    ("modifies_input", "softmax", "run", {"input_written"}),
    ("returns_previous_result", "softmax", "static", {"kernel_state"}),
    ("writes_nothing", "softmax", "compare", {"unwritten"}),
    # issue 33, class 4: shapes the draw never made (the contract shapes make them)
    ("wrong_when_cols_over_8208", "softmax", "compare", {"wrong_value"}),
    ("wrong_when_rows_over_128_and_cols_over_64", "softmax", "compare", {"unwritten"}),
    # the race on the shared sum can also read it as 0 mid-row: 0/0 and x/0
    ("data_race", "softmax", "compare", {"wrong_value", "nondeterministic", "non_finite"}),
    ("segfaults", "softmax", "run", {"crashed"}),
    ("loops_forever", "softmax", "run", {"timeout"}),
    ("allocates_50gib", "softmax", "run", {"memory_limit"}),
    ("calls_exit", "softmax", "static", {"forbidden_symbol"}),
    ("exits_by_syscall", "softmax", "static", {"forbidden_construct"}),  # inline asm
    ("sleeps_with_usleep", "softmax", "static", {"forbidden_symbol"}),
]


ALSO = {
    # a read one past the end faults where the buffer ends at its guard page, and reads
    # a canary (a huge finite float) where it does not: both are refusals
    "reads_out_of_bounds": {("compare", "non_finite"), ("compare", "wrong_value")},
}


@pytest.mark.parametrize(("name", "problem", "stage", "reasons"), PLANTED)
def test_planted_kernel_is_rejected(
    name: str, problem: str, stage: str, reasons: set[str], cpu_backend: CpuBackend
) -> None:
    backend = cpu_backend
    if name == "loops_forever":  # the whole wall-clock limit is spent: keep it short
        backend = CpuBackend(
            cache_dir=cpu_backend.cache_dir,
            verify_limits=Limits(cpu_seconds=10, address_space_bytes=4 << 30, wall_seconds=3.0),
        )
    verdict = verify(BUILTIN[problem], backend, planted(name), FLAGS)
    assert not verdict.verified
    rejection = verdict.rejection
    assert rejection is not None
    allowed = {(stage, r) for r in reasons} | ALSO.get(name, set())
    assert (rejection.stage, rejection.reason) in allowed, rejection
    assert rejection.message
    assert rejection.evidence


def test_rejections_carry_specific_evidence(cpu_backend: CpuBackend) -> None:
    soft = BUILTIN["softmax"]
    crashed = verify(soft, cpu_backend, planted("segfaults"), FLAGS).rejection
    assert crashed is not None and crashed.evidence["signal"] == "SIGSEGV"
    during = crashed.evidence.get("during", crashed.evidence.get("progress", ""))
    assert "trial 0 run 0" in during, crashed.evidence
    wrong = verify(soft, cpu_backend, planted("tail_off_by_one"), FLAGS).rejection
    assert wrong is not None
    assert {"first_index", "expected", "got", "distribution", "shape"} <= set(wrong.evidence)
    assert float(wrong.evidence["got"]) != float(wrong.evidence["expected"])
    memory = verify(soft, cpu_backend, planted("allocates_50gib"), FLAGS).rejection
    assert memory is not None and "53687091200 bytes" in memory.message
    exited = verify(soft, cpu_backend, planted("calls_exit"), FLAGS).rejection
    assert exited is not None and exited.evidence["forbidden"] == "exit"
    broken = verify(soft, cpu_backend, "void kernel(const float *x) { oops }", FLAGS).rejection
    assert broken is not None and broken.stage == "compile"
    assert "error" in broken.evidence["log"]


def test_flags_outside_the_allowlist_are_a_compile_rejection(cpu_backend: CpuBackend) -> None:
    source = (EXAMPLES / "softmax.c").read_text()
    verdict = verify(BUILTIN["softmax"], cpu_backend, source, ("-O3", "-fplugin=evil.so"))
    assert verdict.rejection is not None
    assert (verdict.rejection.stage, verdict.rejection.reason) == ("compile", "bad_flags")


def test_the_worker_survives_every_planted_kernel(cpu_backend: CpuBackend) -> None:
    pid = os.getpid()
    started = time.monotonic()
    for name in ("segfaults", "allocates_50gib", "exits_by_syscall", "reads_out_of_bounds"):
        verify(BUILTIN["softmax"], cpu_backend, planted(name), FLAGS)
    assert os.getpid() == pid
    after = verify(BUILTIN["softmax"], cpu_backend, (EXAMPLES / "softmax.c").read_text(), FLAGS)
    assert after.verified
    assert time.monotonic() - started < 60


def test_where_the_exact_result_overflows_only_that_infinity_passes() -> None:
    """fp16 matmul of large inputs: every exact result is beyond 65504. The rounded
    answer (all infinities) passes; zeros, or the other infinity, do not."""
    spec = BUILTIN["matmul"]
    shape = {"M": 8, "N": 8, "K": 64}
    inputs = spec.generate(shape, "normal", 5, "fp16")
    inputs = {name: np.full_like(a, 300.0) for name, a in inputs.items()}
    exact = spec.expected(inputs)["C"]
    assert np.all(exact > 65504)
    with np.errstate(over="ignore"):
        rounded = exact.astype(np.float16)
    tolerance = spec.tolerances["fp16"]
    poison = 0x7E01  # a NaN no kernel writes
    assert check_outputs(spec, tolerance, inputs, {"C": rounded}, poison)[0] is None
    for wrong in (np.zeros_like(rounded), -rounded, np.full_like(rounded, 1000.0)):
        rejection, _ = check_outputs(spec, tolerance, inputs, {"C": wrong}, poison)
        assert rejection is not None
        assert rejection.reason in {"wrong_value", "non_finite"}, rejection


@pytest.mark.parametrize("problem", ["softmax", "rmsnorm", "layernorm"])
def test_the_draw_covers_the_contract(problem: str) -> None:
    """Issue 33, class 4: each check verifies one shape with both dims at least 256, one
    with cols beyond 8208, and one of at least 2^20 elements, each once (single calls),
    and the problem states the envelope it verifies on."""
    spec = BUILTIN[problem]
    for seed in range(5):
        contract = [t for t in plan_trials(spec, "fp32", seed) if t.runs == 1]
        shapes = [t.shape for t in contract]
        assert any(s["rows"] >= 256 and s["cols"] >= 256 for s in shapes), shapes
        assert any(s["cols"] > 8208 for s in shapes), shapes
        assert any(s["rows"] * s["cols"] >= 1 << 20 for s in shapes), shapes
        assert {t.distribution for t in contract} == {spec.distributions[0]}
    assert "2^20" in spec.envelope


def test_the_draw_covers_the_contract_of_gelu_matmul_and_kda() -> None:
    """The same for the element-wise gelu (at least 2^20 elements, so beyond 8192 too), for
    matmul (all three dims at least 256, K beyond 8208, an output of 2^20 elements) and for
    kda (K and V at least 256, V beyond 8208, an output of 2^20 elements)."""
    for seed in range(5):
        gelu = [t.shape for t in plan_trials(BUILTIN["gelu"], "fp32", seed) if t.runs == 1]
        assert any(s["n"] >= 1 << 20 for s in gelu), gelu
        matmul = [t.shape for t in plan_trials(BUILTIN["matmul"], "fp32", seed) if t.runs == 1]
        assert any(min(s["M"], s["N"], s["K"]) >= 256 for s in matmul), matmul
        assert any(s["K"] > 8208 for s in matmul), matmul
        assert any(s["M"] * s["N"] >= 1 << 20 for s in matmul), matmul
        kda = [t.shape for t in plan_trials(BUILTIN["kda"], "fp32", seed) if t.runs == 1]
        assert any(s["K"] >= 256 and s["V"] >= 256 for s in kda), kda
        assert any(s["V"] > 8208 for s in kda), kda
        assert any(s["B"] * s["T"] * s["H"] * s["V"] >= 1 << 20 for s in kda), kda
    assert all("2^20" in BUILTIN[name].envelope for name in ("gelu", "matmul", "kda"))
