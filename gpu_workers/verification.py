"""Verification rules, the same for every device: stages compile, static, run, compare.

A device back end (`gpu_workers.protocols.DeviceBackend`) compiles, checks statically
and runs kernels in its sandbox; this module decides. Rules: every check draws a fresh
secret seed (recorded in the verdict, so an audit can replay it); from it come the test
shapes (fixed edge shapes plus shapes drawn per check: tall, wide, page-sized, ragged)
and fresh inputs for every trial, from every distribution the problem supports
(including NaN/Inf, values near the type's limits, masked rows and wide spreads);
outputs poisoned before every run and every element checked; NaN and Inf pass only where
the float64 reference gives exactly that (NaN where it gives NaN, the same infinity, or
the infinity a finite result rounds to); inputs must be unchanged; writes past the end
are caught; a second run on the same inputs must agree bit for bit (any NaN equals any
NaN): `RUNS_PER_TRIAL` runs per trial, `STRESS_RUNS` on the largest test shape, where
races show.

Every verdict names its worst element (`Verdict.worst`, a `WorstElement`): the trial's
shape, distribution and seed, the output and index, got, expected, the error, the scale
and the error allowed there, and the share of the tolerance used (`used`; 1.0 is the
limit). In a verified kernel it is the element closest to failing; in a `wrong_value`
rejection, the worst wrong one; otherwise None (the evidence names the first fault).
Each `TrialReport` keeps its own largest share (`worst_used`), from which `kfactory
check` prints the margin per distribution (`ops/check_cmd.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_workers.deadlines import pace_of
from gpu_workers.protocols import BuildT, CompileOutcome, DeviceBackend, RunOutput, Trial
from gpu_workers.quick_compare import all_pass
from gpu_workers.results import Pace, Rejection, SandboxReport, TrialReport, Verdict, WorstElement
from kernels.spec import Array, Arrays, Problem, Tolerance

RUNS_PER_TRIAL = 2
STRESS_RUNS = 6
"""Runs per trial on the largest test shape, where threads overlap most: races show there."""


def trial_seed(base_seed: int, index: int, salt: str = "trial") -> int:
    digest = hashlib.sha256(f"{salt}:{base_seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def new_seed() -> int:
    """A secret seed for one check: no kernel can know its inputs or shapes in advance."""
    return secrets.randbits(63)


def trial_shapes(problem: Problem, seed: int) -> tuple[dict[str, int], ...]:
    """The shapes one check runs: the problem's fixed edge shapes and those drawn from `seed`."""
    return problem.trial_shapes(np.random.default_rng(trial_seed(seed, 0, "shapes")))


def contract_shapes(problem: Problem, seed: int) -> tuple[dict[str, int], ...]:
    """The contract shapes one check verifies once each (`Problem.contract_shapes`)."""
    return problem.contract_trial_shapes(np.random.default_rng(trial_seed(seed, 0, "contract")))


def plan_trials(
    problem: Problem, dtype: str = "fp32", seed: int = 0, smallest: int | None = None
) -> list[Trial]:
    """Fresh inputs for every (shape, distribution) pair; `seed` makes them reproducible.
    The largest shape is the race-stress shape: its first distribution runs STRESS_RUNS times.
    Then the problem's contract shapes (`Problem.contract_shapes`), one call each.
    `smallest`: only that many of the shapes, the smallest in bytes, and no contract
    shape (a quick check)."""
    trials: list[Trial] = []
    shapes = trial_shapes(problem, seed)
    if smallest is not None:
        shapes = tuple(sorted(shapes, key=problem.nbytes)[:smallest])
    largest = max(range(len(shapes)), key=lambda i: problem.nbytes(shapes[i]))
    for number, shape in enumerate(shapes):
        for d, distribution in enumerate(problem.distributions):
            runs = STRESS_RUNS if number == largest and d == 0 else RUNS_PER_TRIAL
            index = len(trials)
            s = trial_seed(seed, index)
            inputs = problem.generate(shape, distribution, s, dtype)
            trials.append(Trial(index, dict(shape), distribution, s, inputs, runs))
    contract = contract_shapes(problem, seed) if smallest is None else ()
    for shape in contract:  # large: one call each, first distribution
        index = len(trials)
        s = trial_seed(seed, index)
        distribution = problem.distributions[0]
        inputs = problem.generate(shape, distribution, s, dtype)
        trials.append(Trial(index, dict(shape), distribution, s, inputs, 1))
    return trials


def bits(values: Array) -> Array:
    """The raw bits of each element, as unsigned integers of the element's size."""
    return values.view(np.dtype(f"uint{8 * values.dtype.itemsize}"))


def rounded_infinities(expected: Array, dtype: np.dtype[Any]) -> Array:
    """Where a finite exact result rounds to infinity in `dtype` (it exceeds the type)."""
    with np.errstate(over="ignore"):
        rounded = expected.astype(dtype).astype(np.float64)
    return np.isinf(rounded) & np.isfinite(expected)


def overflowed_to(expected: Array) -> Array:
    return np.copysign(np.inf, expected)


def _where(shape: tuple[int, ...], flat: int) -> str:
    return str(tuple(int(i) for i in np.unravel_index(flat, shape)))


@dataclass(frozen=True)
class WorstError:
    """`rel` the largest relative error of one comparison; the rest the element closest
    to failing (the worst failing one in a rejection): the one whose error used the
    largest share of its tolerance, `used` (1.0 = at the limit)."""

    rel: float = 0.0
    output: str = ""
    index: tuple[int, ...] = ()
    got: float = 0.0
    expected: float = 0.0
    scale: float = 0.0
    used: float = 0.0


def _share(err: Array, allowed: Array) -> Array:
    """err / allowed, 0 where nothing is allowed (an error there already failed)."""
    return np.divide(err, allowed, out=np.zeros_like(err), where=allowed > 0)


def check_outputs(
    problem: Problem,
    tolerance: Tolerance,
    inputs: Arrays,
    got: Arrays,
    poison_bits: int,
    stage: str = "compare",
    context: dict[str, str] | None = None,
    expected: Arrays | None = None,
) -> tuple[Rejection | None, float]:
    """Every element of every output against the float64 reference (`expected`, computed
    from `inputs` unless given). Returns the rejection (or None) and the largest relative
    error |got - expected| / scale seen."""
    rejection, worst = compare_outputs(
        problem, tolerance, inputs, got, poison_bits, stage, context, expected
    )
    return rejection, worst.rel


def compare_outputs(
    problem: Problem,
    tolerance: Tolerance,
    inputs: Arrays,
    got: Arrays,
    poison_bits: int,
    stage: str = "compare",
    context: dict[str, str] | None = None,
    expected: Arrays | None = None,
    scales: Arrays | None = None,
) -> tuple[Rejection | None, WorstError]:
    """`check_outputs`, naming the worst element. Where the reference is NaN the kernel must
    give a NaN (any NaN but the poison, which means unwritten); where it is an infinity,
    that infinity; where it is finite, a finite value within tolerance, or the infinity
    the exact result rounds to in the output type."""
    expected = problem.expected(inputs) if expected is None else expected
    scales = problem.scales(inputs, expected) if scales is None else scales
    passed = _all_pass(problem, tolerance, got, poison_bits, expected, scales)
    if passed is not None:
        return None, passed
    return compare_whole(problem, tolerance, got, poison_bits, stage, context, expected, scales)


def compare_whole(
    problem: Problem,
    tolerance: Tolerance,
    got: Arrays,
    poison_bits: int,
    stage: str,
    context: dict[str, str] | None,
    expected: Arrays,
    scales: Arrays,
) -> tuple[Rejection | None, WorstError]:
    """The rules of `compare_outputs` on whole arrays, with the evidence of a failure."""
    ctx = dict(context or {})
    worst = WorstError()
    for arg in problem.outputs:
        g = got[arg.name]
        e = np.asarray(expected[arg.name], dtype=np.float64)
        scale = np.asarray(scales[arg.name], dtype=np.float64)
        if g.shape != e.shape:
            return _reject(stage, "wrong_shape", f"{arg.name} has shape {g.shape}", ctx), worst
        flat_g = g.reshape(-1)
        unwritten = np.flatnonzero(bits(flat_g) == poison_bits)
        if unwritten.size:
            i = int(unwritten[0])
            return _reject(
                stage,
                "unwritten",
                f"{arg.name}{_where(g.shape, i)} was never written "
                f"({unwritten.size} of {flat_g.size} elements still hold the poison)",
                {
                    **ctx,
                    "output": arg.name,
                    "first_index": _where(g.shape, i),
                    "unwritten_count": str(unwritten.size),
                    "expected": repr(e.reshape(-1)[i]),
                },
            ), worst
        g64 = flat_g.astype(np.float64)
        e64, s64 = e.reshape(-1), scale.reshape(-1)
        # The reference's own NaN and infinities are the answer there: the kernel must
        # give NaN where it gives NaN, and the same infinity.
        exact_nan = np.isnan(e64)
        exact_inf = np.isinf(e64)
        lost = np.flatnonzero((exact_nan & ~np.isnan(g64)) | (exact_inf & (g64 != e64)))
        if lost.size:
            i = int(lost[0])
            return _reject(
                stage,
                "lost_non_finite",
                f"{arg.name}{_where(g.shape, i)} is {g64[i]:.8g} where the reference gives "
                f"{e64[i]}; {lost.size} elements lose the reference's NaN or infinity",
                {
                    **ctx,
                    "output": arg.name,
                    "first_index": _where(g.shape, i),
                    "got": repr(float(g64[i])),
                    "expected": repr(float(e64[i])),
                    "lost_count": str(lost.size),
                },
            ), worst
        finite = ~(exact_nan | exact_inf)
        # Where the exact result overflows the output type, the right answer is that
        # infinity; everywhere else a finite reference needs a finite answer.
        right_infinity = rounded_infinities(e64, flat_g.dtype) & (g64 == overflowed_to(e64))
        nonfinite = np.flatnonzero(finite & ~np.isfinite(g64) & ~right_infinity)
        if nonfinite.size:
            i = int(nonfinite[0])
            return _reject(
                stage,
                "non_finite",
                f"{arg.name}{_where(g.shape, i)} is {g64[i]} (expected {e64[i]:.6g}); "
                f"{nonfinite.size} non-finite elements",
                {
                    **ctx,
                    "output": arg.name,
                    "first_index": _where(g.shape, i),
                    "got": repr(float(g64[i])),
                    "expected": repr(float(e64[i])),
                    "non_finite_count": str(nonfinite.size),
                },
            ), worst
        # A finite value where the exact result overflows is judged by its error, as
        # anywhere. A scale that is not finite where the reference is (an Inf * 0 in a
        # magnitude sum) falls back to |expected|: it never widens the tolerance.
        judged = finite & ~right_infinity
        with np.errstate(invalid="ignore"):
            err = np.where(judged, np.abs(g64 - e64), 0.0)
            s64 = np.where(np.isfinite(s64), s64, np.where(finite, np.abs(e64), 0.0))
        rel = err / np.maximum(s64, tolerance.atol / tolerance.rtol)
        allowed = tolerance.atol + tolerance.rtol * s64
        used = _share(err, allowed)
        if judged.any():  # the worst of the elements judged by their error
            w = int(np.argmax(np.where(judged, used, -1.0)))
            top = max(worst.rel, float(np.max(np.where(judged, rel, 0.0))))
            if float(used[w]) >= worst.used:
                worst = WorstError(
                    rel=top,
                    output=arg.name,
                    index=tuple(int(i) for i in np.unravel_index(w, g.shape)),
                    got=float(g64[w]),
                    expected=float(e64[w]),
                    scale=float(s64[w]),
                    used=float(used[w]),
                )
            else:
                worst = dataclasses.replace(worst, rel=top)
        bad = np.flatnonzero(err > allowed)
        if bad.size:
            i = int(bad[0])
            w = int(bad[np.argmax(used[bad])])
            edge = near_the_scale_edge(float(err[w]), float(allowed[w]), float(g64[w]))
            return _reject(
                stage,
                "wrong_value",
                f"{arg.name}{_where(g.shape, i)} = {g64[i]:.8g}, expected {e64[i]:.8g} "
                f"({bad.size} of {err.size} elements outside tolerance)" + edge,
                {
                    **ctx,
                    "output": arg.name,
                    "first_index": _where(g.shape, i),
                    "got": repr(float(g64[i])),
                    "expected": repr(float(e64[i])),
                    "wrong_count": str(bad.size),
                    "worst_index": _where(g.shape, w),
                    "worst_got": repr(float(g64[w])),
                    "worst_expected": repr(float(e64[w])),
                    "worst_abs_err": repr(float(err[w])),
                    "worst_scale": repr(float(s64[w])),
                    "worst_allowed": repr(float(allowed[w])),
                    "worst_used": f"{float(used[w]):.6g}",
                    "tolerance": f"atol={tolerance.atol} rtol={tolerance.rtol} x scale",
                },
            ), worst
    return None, worst


#: A wrong value within this factor of what the scale allows may be rounding the scale
#: does not foresee, rather than a wrong kernel: the rejection says what governs it.
EDGE_FACTOR = 1e3
GOVERNED_BY = (
    "; within reach of the error scale's edge: the problem's `error_scale` (default "
    "|expected|, at least the rounding of its row's largest output), its `tolerances` "
    "(atol + rtol x scale) and its `input_limit` (the largest input drawn) govern it"
)


def near_the_scale_edge(error: float, allowed: float, got: float) -> str:
    """GOVERNED_BY for a wrong value close to its allowance, or one that underflowed (to
    zero or a denormal, below float32's smallest normal); else nothing."""
    underflowed = abs(got) < np.finfo(np.float32).tiny
    return GOVERNED_BY if underflowed or error <= EDGE_FACTOR * allowed else ""


def _all_pass(
    problem: Problem,
    tolerance: Tolerance,
    got: Arrays,
    poison_bits: int,
    expected: Arrays,
    scales: Arrays,
) -> WorstError | None:
    """The worst element when every element of every output passes (checked in cached
    chunks, `quick_compare`); None when any fails, and the whole-array rules say why."""
    worst = WorstError()
    for arg in problem.outputs:
        g, e = got[arg.name], np.asarray(expected[arg.name])
        if g.shape != e.shape:
            return None
        found = all_pass(g, e, scales[arg.name], poison_bits, tolerance)
        if found is None:
            return None
        top = max(worst.rel, found.rel)
        if found.used >= worst.used:
            worst = WorstError(
                rel=top,
                output=arg.name,
                index=tuple(int(i) for i in np.unravel_index(found.flat_index, g.shape)),
                got=found.got,
                expected=found.expected,
                scale=found.scale,
                used=found.used,
            )
        else:
            worst = dataclasses.replace(worst, rel=top)
    return worst


def _reject(stage: str, reason: str, message: str, evidence: dict[str, str]) -> Rejection:
    return Rejection(stage=stage, reason=reason, message=message, evidence=evidence)  # type: ignore[arg-type]


def _trial_context(trial: Trial, run: int) -> dict[str, str]:
    return {
        "trial": str(trial.index),
        "run": str(run),
        "shape": str(trial.shape),
        "distribution": trial.distribution,
        "seed": str(trial.seed),
    }


@dataclass(frozen=True)
class Judgement:
    rejection: Rejection | None
    reports: list[TrialReport]
    max_rel_err: float
    worst: WorstElement | None = None
    """The element closest to failing (verified), or the worst wrong one (wrong_value)."""


def _element(trial: Trial, worst: WorstError, tolerance: Tolerance) -> WorstElement:
    return WorstElement(
        shape=dict(trial.shape),
        distribution=trial.distribution,
        seed=trial.seed,
        output=worst.output,
        index=worst.index,
        got=worst.got,
        expected=worst.expected,
        error=abs(worst.got - worst.expected),
        scale=worst.scale,
        allowed=tolerance.atol + tolerance.rtol * worst.scale,
        used=worst.used,
    )


def judge_runs(
    problem: Problem, tolerance: Tolerance, trials: list[Trial], runs: list[RunOutput]
) -> Judgement:
    """Every run of every trial judged; the first fault is the rejection."""
    by_trial: dict[int, list[RunOutput]] = {}
    for r in runs:
        by_trial.setdefault(r.trial, []).append(r)
    reports: list[TrialReport] = []
    worst_overall = 0.0
    closest: WorstElement | None = None
    for trial in trials:
        trial_runs = sorted(by_trial.get(trial.index, []), key=lambda r: r.run)
        if len(trial_runs) != trial.runs:
            ctx = _trial_context(trial, len(trial_runs))
            return Judgement(
                _reject("run", "missing_result", "the device returned no result", ctx),
                reports,
                worst_overall,
            )
        worst = WorstError()
        expected = problem.expected(trial.inputs)  # once per trial, not once per run
        scales = problem.scales(trial.inputs, expected)
        for r in trial_runs:
            ctx = _trial_context(trial, r.run)
            if r.damaged_slack:
                return Judgement(
                    _reject(
                        "run",
                        "out_of_bounds_write",
                        f"wrote past the end of {', '.join(r.damaged_slack)}",
                        {**ctx, "buffers": " ".join(r.damaged_slack)},
                    ),
                    reports,
                    worst_overall,
                )
            for arg in problem.inputs:
                before = bits(trial.inputs[arg.name].reshape(-1))
                after = bits(r.inputs_after[arg.name].reshape(-1))
                changed = np.flatnonzero(before != after)
                if changed.size:
                    i = int(changed[0])
                    shape = trial.inputs[arg.name].shape
                    return Judgement(
                        _reject(
                            "compare",
                            "input_modified",
                            f"input {arg.name}{_where(shape, i)} changed during the run "
                            f"({changed.size} elements)",
                            {
                                **ctx,
                                "input": arg.name,
                                "first_index": _where(shape, i),
                                "before": repr(float(trial.inputs[arg.name].reshape(-1)[i])),
                                "after": repr(float(r.inputs_after[arg.name].reshape(-1)[i])),
                            },
                        ),
                        reports,
                        worst_overall,
                    )
            rejection, err = compare_outputs(
                problem,
                tolerance,
                trial.inputs,
                r.outputs,
                r.poison_bits,
                context=ctx,
                expected=expected,
                scales=scales,
            )
            if rejection is not None:
                failed = (
                    _element(trial, err, tolerance) if rejection.reason == "wrong_value" else None
                )
                return Judgement(rejection, reports, worst_overall, failed)
            top = max(worst.rel, err.rel)
            worst = err if err.used > worst.used or not worst.output else worst
            worst = dataclasses.replace(worst, rel=top)
        first = trial_runs[0]
        for other in trial_runs[1:]:
            for arg in problem.outputs:
                a_values = first.outputs[arg.name].reshape(-1)
                b_values = other.outputs[arg.name].reshape(-1)
                both_nan = np.isnan(a_values.astype(np.float32)) & np.isnan(
                    b_values.astype(np.float32)
                )
                differ = np.flatnonzero((bits(a_values) != bits(b_values)) & ~both_nan)
                if differ.size:
                    i = int(differ[0])
                    shape = first.outputs[arg.name].shape
                    return Judgement(
                        _reject(
                            "compare",
                            "nondeterministic",
                            f"runs 0 and {other.run} on the same inputs disagree at "
                            f"{arg.name}{_where(shape, i)} ({differ.size} elements)",
                            {
                                **_trial_context(trial, other.run),
                                "output": arg.name,
                                "first_index": _where(shape, i),
                                "run0": repr(float(first.outputs[arg.name].reshape(-1)[i])),
                                f"run{other.run}": repr(
                                    float(other.outputs[arg.name].reshape(-1)[i])
                                ),
                            },
                        ),
                        reports,
                        worst_overall,
                    )
        reports.append(
            TrialReport(
                shape=trial.shape,
                distribution=trial.distribution,
                seed=trial.seed,
                max_rel_err=worst.rel,
                worst_output=worst.output,
                worst_index=worst.index,
                worst_got=worst.got,
                worst_expected=worst.expected,
                worst_scale=worst.scale,
                worst_used=worst.used,
            )
        )
        worst_overall = max(worst_overall, worst.rel)
        if worst.output and (closest is None or worst.used >= closest.used):
            closest = _element(trial, worst, tolerance)
    return Judgement(None, reports, worst_overall, closest)


def precheck(
    problem: Problem,
    backend: DeviceBackend[BuildT],
    source: str,
    flags: tuple[str, ...],
    dtype: str,
) -> CompileOutcome[BuildT]:
    """The stages that need no device, compile and static: a build, or why there is none."""
    if dtype not in problem.tolerances:
        reason = f"{problem.name} has no tolerance for {dtype}; it takes {problem.dtypes}"
        return CompileOutcome(None, _reject("compile", "unsupported_dtype", reason, {}))
    compiled = backend.compile(problem, source, flags, dtype)
    if compiled.rejection is not None:
        return compiled
    if compiled.build is None:
        missing = _reject("compile", "no_build", "the back end returned no build", {})
        return CompileOutcome(None, missing, compiled.cache_hit)
    static = backend.static_check(problem, compiled.build)
    if static is not None:
        return CompileOutcome(None, static, compiled.cache_hit)
    return compiled


def verify(
    problem: Problem,
    backend: DeviceBackend[BuildT],
    source: str,
    flags: tuple[str, ...],
    *,
    dtype: str = "fp32",
    seed: int | None = None,
    smallest: int | None = None,
) -> Verdict:
    """Run every stage; the first failure ends verification with its evidence. Without a
    `seed` a fresh secret one is drawn; the verdict records it, and the same seed replays
    exactly the same shapes and inputs. `smallest`: only that many test shapes, the
    smallest (a quick check, never a verifier's verdict)."""
    check_seed = new_seed() if seed is None else seed

    def done(
        rejection: Rejection | None,
        *,
        trials: tuple[TrialReport, ...] = (),
        max_rel_err: float | None = None,
        worst: WorstElement | None = None,
        cache_hit: bool = False,
        sandbox: SandboxReport | None = None,
        pace: Pace | None = None,
    ) -> Verdict:
        return Verdict(
            problem=problem.name,
            target=backend.target,
            dtype=dtype,
            source_sha256=hashlib.sha256(source.encode()).hexdigest(),
            flags=tuple(flags),
            verified=rejection is None,
            rejection=rejection,
            trials=trials,
            max_rel_err=max_rel_err,
            worst=worst,
            compile_cache_hit=cache_hit,
            sandbox=sandbox,
            seed=check_seed,
            pace=pace,
        )

    compiled = precheck(problem, backend, source, flags, dtype)
    if compiled.rejection is not None or compiled.build is None:
        return done(compiled.rejection, cache_hit=compiled.cache_hit)
    trials = plan_trials(problem, dtype, check_seed, smallest)
    started = time.monotonic()
    outcome = backend.run_trials(problem, compiled.build, trials)
    pace = pace_of(problem, ((t.shape, t.runs) for t in trials), time.monotonic() - started, dtype)
    if outcome.rejection is not None:
        return done(outcome.rejection, cache_hit=compiled.cache_hit, sandbox=outcome.sandbox)
    judged = judge_runs(problem, problem.tolerances[dtype], trials, outcome.runs)
    return done(
        judged.rejection,
        trials=tuple(judged.reports),
        max_rel_err=judged.max_rel_err,
        worst=judged.worst,
        cache_hit=compiled.cache_hit,
        sandbox=outcome.sandbox,
        pace=pace,
    )
