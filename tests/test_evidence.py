"""Evidence the kernel cannot predict (issue 9, class 7): a secret seed per check, drawn
shapes beyond the fixed ones, NaN/Inf, values near the type's limits, masked rows, wide
spreads; each hole has a planted kernel that only it catches, named with its seed."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.cpu.build import CompiledKernel, compile_kernel
from gpu_workers.cpu.toolchain import nan_safe
from gpu_workers.protocols import RunOutput, Trial
from gpu_workers.verification import (
    check_outputs,
    judge_runs,
    plan_trials,
    trial_shapes,
    verify,
)
from kernels.builtin import BUILTIN
from kernels.templates import EXAMPLE_TEMPLATES, TEMPLATES
from tests.cpu_support import EXAMPLES, FLAGS, calibration, cpu_backend, kf_cache, planted

__all__ = ["calibration", "cpu_backend", "kf_cache"]

SOFTMAX = BUILTIN["softmax"]
POISON = 0x7FBADBAD


PLANTED = [
    # (file, what only the new evidence shows, reason, distribution or None)
    ("evidence_fixed_row_buffer", lambda s: s["cols"] > 1024, "wrong_value", None),
    ("evidence_fixed_row_table", lambda s: s["rows"] > 64, "wrong_value", None),
    ("evidence_ignores_nan", lambda s: True, "lost_non_finite", "nonfinite"),
    ("evidence_clamps_range", lambda s: True, "wrong_value", "extreme"),
    ("evidence_skips_masked", lambda s: True, "wrong_value", "mixed"),
]


@pytest.mark.parametrize(("name", "shape_ok", "reason", "distribution"), PLANTED)
def test_a_planted_kernel_per_hole_is_rejected_with_its_distribution_and_seed(
    name: str, shape_ok: object, reason: str, distribution: str | None, cpu_backend: CpuBackend
) -> None:
    verdict = verify(SOFTMAX, cpu_backend, planted(name), FLAGS)
    rejection = verdict.rejection
    assert rejection is not None, f"{name} passed with seed {verdict.seed}"
    assert (rejection.stage, rejection.reason) == ("compare", reason), (verdict.seed, rejection)
    evidence = rejection.evidence
    if distribution is not None:
        assert evidence["distribution"] == distribution, (verdict.seed, rejection)
    assert verdict.seed is not None
    trial = plan_trials(SOFTMAX, seed=verdict.seed)[int(evidence["trial"])]
    assert evidence["seed"] == str(trial.seed)
    assert evidence["shape"] == str(trial.shape)
    assert callable(shape_ok) and shape_ok(trial.shape), (verdict.seed, trial.shape)
    # every such kernel passes what the fixed shapes and old distributions could show
    old = [t for t in plan_trials(SOFTMAX, seed=verdict.seed) if t.shape in SOFTMAX.test_shapes]
    old = [t for t in old if t.distribution in ("normal", "uniform", "large", "tiny", "ties")]
    assert int(evidence["trial"]) not in {t.index for t in old}


def test_checks_draw_fresh_seeds_and_shapes_and_a_recorded_seed_replays_them(
    cpu_backend: CpuBackend,
) -> None:
    source = planted("evidence_fixed_row_buffer")
    first = verify(SOFTMAX, cpu_backend, source, FLAGS)
    second = verify(SOFTMAX, cpu_backend, source, FLAGS)
    assert first.seed is not None and second.seed is not None and first.seed != second.seed
    assert trial_shapes(SOFTMAX, first.seed) != trial_shapes(SOFTMAX, second.seed)
    replay = verify(SOFTMAX, cpu_backend, source, FLAGS, seed=first.seed)
    assert replay.seed == first.seed
    assert replay.rejection == first.rejection  # the same trial, index, values and seed
    a, b = plan_trials(SOFTMAX, seed=first.seed), plan_trials(SOFTMAX, seed=first.seed)
    assert [(t.shape, t.distribution, t.seed, t.runs) for t in a] == [
        (t.shape, t.distribution, t.seed, t.runs) for t in b
    ]
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.inputs["x"].view(np.uint32), y.inputs["x"].view(np.uint32))


def test_a_verified_kernel_replays_to_the_same_trials(cpu_backend: CpuBackend) -> None:
    source = (EXAMPLES / "softmax.c").read_text()
    flags = tuple(source.splitlines()[0].split(":", 1)[1].split())
    verdict = verify(SOFTMAX, cpu_backend, source, flags)
    assert verdict.verified, (verdict.seed, verdict.rejection)
    again = verify(SOFTMAX, cpu_backend, source, flags, seed=verdict.seed)
    # the same trials, values and worst elements (compared as encoded: NaN == NaN there)
    assert msgspec.json.encode(again.trials) == msgspec.json.encode(verdict.trials)
    worst = max(verdict.trials, key=lambda t: t.max_rel_err)
    assert worst.max_rel_err == verdict.max_rel_err
    assert worst.worst_output == "y" and len(worst.worst_index) == 2


def test_finite_math_only_would_license_ignoring_nan_so_kernels_are_built_without_it(
    cpu_backend: CpuBackend,
) -> None:
    """The softmax example, built with -ffast-math as such (bypassing the back end's
    `nan_safe`): its clamped exp turns NaN into a finite number, and the check catches it.
    Built the way the back end builds it, the same source passes every distribution."""
    assert nan_safe(("-O3", "-ffast-math")) == ("-O3", "-ffast-math", NAN_SAFE)
    assert nan_safe(("-Ofast", NAN_SAFE)) == ("-Ofast", NAN_SAFE)
    assert nan_safe(("-O3",)) == ("-O3",)
    template = TEMPLATES[EXAMPLE_TEMPLATES["softmax"]]
    rendered = template.render(template.best_known)
    assert "-ffast-math" in rendered.flags
    build = compile_kernel(
        rendered.source,
        tuple(rendered.flags),
        prototype=SOFTMAX.c_signature(),
        cache_dir=cpu_backend.cache_dir,
    )
    assert isinstance(build, CompiledKernel), build
    trials = [t for t in plan_trials(SOFTMAX, seed=1) if t.distribution == "nonfinite"]
    outcome = cpu_backend.run_trials(SOFTMAX, build, trials)
    rejection = judge_runs(SOFTMAX, SOFTMAX.tolerances["fp32"], trials, outcome.runs).rejection
    assert rejection is not None and rejection.reason in {"lost_non_finite", "non_finite"}
    assert verify(SOFTMAX, cpu_backend, rendered.source, rendered.flags, seed=1).verified


NAN_SAFE = "-fno-finite-math-only"


def test_the_reference_nan_and_infinities_are_demanded_and_poison_is_still_unwritten() -> None:
    x = np.array([[1.0, np.nan, 2.0], [1.0, np.inf, 2.0], [1.0, -np.inf, 2.0]], np.float32)
    inputs = {"x": x}
    expected = SOFTMAX.expected(inputs)["y"]
    tolerance = SOFTMAX.tolerances["fp32"]
    right = expected.astype(np.float32)
    assert check_outputs(SOFTMAX, tolerance, inputs, {"y": right}, POISON)[0] is None
    other_nan = right.copy()
    other_nan[0] = np.float32(-np.nan)  # any NaN but the poison is a NaN
    assert check_outputs(SOFTMAX, tolerance, inputs, {"y": other_nan}, POISON)[0] is None
    finite = right.copy()
    finite[0] = 1 / 3  # a plausible row where the reference says NaN
    rejection, _ = check_outputs(SOFTMAX, tolerance, inputs, {"y": finite}, POISON)
    assert rejection is not None and rejection.reason == "lost_non_finite"
    assert rejection.evidence["expected"] == "nan"
    poisoned = right.copy()
    poisoned.view(np.uint32)[1, 0] = POISON  # a NaN expected there, but this one is poison
    rejection, _ = check_outputs(SOFTMAX, tolerance, inputs, {"y": poisoned}, POISON)
    assert rejection is not None and rejection.reason == "unwritten"
    nan_in_finite_row = right.copy()
    nan_in_finite_row[2, 0] = np.nan
    rejection, _ = check_outputs(SOFTMAX, tolerance, inputs, {"y": nan_in_finite_row}, POISON)
    assert rejection is not None and rejection.reason == "non_finite"
    mm = BUILTIN["matmul"]
    a = np.array([[np.inf, 1.0], [1.0, 1.0]], np.float32)
    b = np.array([[1.0, -1.0], [0.0, 1.0]], np.float32)
    c = mm.expected({"A": a, "B": b})["C"]
    assert np.isposinf(c[0, 0]) and np.isneginf(c[0, 1])
    got = c.astype(np.float32)
    assert check_outputs(mm, mm.tolerances["fp32"], {"A": a, "B": b}, {"C": got}, POISON)[0] is None
    flipped = got.copy()
    flipped[0, 1] = np.inf  # the other infinity
    rejection, _ = check_outputs(
        mm, mm.tolerances["fp32"], {"A": a, "B": b}, {"C": flipped}, POISON
    )
    assert rejection is not None and rejection.reason == "lost_non_finite"


def test_two_runs_that_differ_only_in_nan_payloads_agree() -> None:
    x = np.array([[1.0, np.nan, 2.0], [0.0, 1.0, 2.0]], np.float32)
    trial = Trial(0, {"rows": 2, "cols": 3}, "nonfinite", 1, {"x": x}, runs=2)
    y = SOFTMAX.expected({"x": x})["y"].astype(np.float32)
    other = y.copy()
    other.view(np.uint32)[0] = 0xFFC00000  # the other sign of NaN
    runs = [
        RunOutput(0, run, POISON, {"y": out}, {"x": x.copy()}) for run, out in enumerate((y, other))
    ]
    judged = judge_runs(SOFTMAX, SOFTMAX.tolerances["fp32"], [trial], runs)
    assert judged.rejection is None and len(judged.reports) == 1
