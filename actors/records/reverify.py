"""Re-running a campaign's best kernels on the hardware at hand: verified again on fresh
inputs (a new seed, every distribution), then timed again against the baseline.

A claim holds when the new speedup is no lower than the recorded one beyond the spread
both measurements show (the recorded kernel IQR, plus the new kernel and baseline IQRs,
relative to their medians). A host without the target's device makes the stages it can
(compile and static checks for cuda) and says what it skipped.

The kernels are the `k` timed ones with the highest recorded speedups. Each goes through
the harness the verifier and benchmarker use (`gpu_workers.verification.precheck` and
`verify`, then `gpu_workers.targets.compile_and_time`) with one new secret seed. A speedup
recorded on another device than this host's is reported, not judged: "not re-verifiable
here" (`unverifiable`), which `kfactory audit` counts against the campaign.
"""

from __future__ import annotations

import secrets

from actors.campaign.campaign_file import CampaignSpec
from actors.campaign.history import Candidate, History
from eventstore.claims import Claim, agrees, differs, skipped, unverifiable
from gpu_workers.results import BenchmarkResult
from gpu_workers.targets import backend_for, calibration_for, compile_and_time, device_missing
from gpu_workers.verification import precheck, verify
from kernels.loading import load_problem

NO_COMPILER = "no_compiler"


def top_candidates(history: History, campaign_id: str, k: int) -> list[Candidate]:
    timed = [c for c in history.campaign_candidates(campaign_id) if c.benchmark and c.written]
    return sorted(timed, key=lambda c: c.speedup or 0.0, reverse=True)[:k]


def reverify(history: History, campaign_id: str, k: int, seed: int | None = None) -> list[Claim]:
    """Claims about the top `k` kernels (by recorded speedup), re-measured here."""
    spec = history.campaigns[campaign_id].spec
    seed = secrets.randbits(63) if seed is None else seed
    claims: list[Claim] = []
    for rank, candidate in enumerate(top_candidates(history, campaign_id, k), 1):
        claims += _one(spec, candidate, rank, seed)
    if not claims:
        claims.append(skipped("reverify", "best kernels", "the campaign timed no kernel"))
    return claims


def _one(spec: CampaignSpec, candidate: Candidate, rank: int, seed: int) -> list[Claim]:
    written, recorded = candidate.written, candidate.benchmark
    assert written is not None and recorded is not None
    name = f"#{rank} {candidate.candidate_id}"
    problem = load_problem(written.problem)
    backend = backend_for(written.target)
    flags = tuple(written.flags)
    missing = device_missing(written.target)
    if missing is not None:
        outcome = precheck(problem, backend, written.source, flags, written.dtype)
        if outcome.rejection is not None:
            r = outcome.rejection
            if r.reason == NO_COMPILER:  # this host's toolchain, not the kernel
                return [
                    unverifiable("reverify", name, f"not compiled here: {r.message}; {missing}")
                ]
            return [differs("reverify", name, f"compile/static: {r.reason}: {r.message}")]
        return [
            agrees("reverify", name, "compiles and passes the static checks here"),
            unverifiable("reverify", name, f"not run or timed: {missing}"),
        ]
    verdict = verify(problem, backend, written.source, flags, dtype=written.dtype, seed=seed)
    if verdict.rejection is not None:
        r = verdict.rejection
        return [
            differs(
                "reverify",
                name,
                f"rejected on fresh inputs (seed {seed}) at {r.stage}: {r.reason}: {r.message}",
            )
        ]
    claims = [
        agrees(
            "reverify",
            name,
            f"verified again: {len(verdict.trials)} trials over every distribution, "
            f"seed {seed}, max relative error {verdict.max_rel_err:.3g}",
        )
    ]
    shape = dict(zip(problem.dims, spec.shapes[0], strict=True)) if spec.shapes else None
    result = compile_and_time(
        written.target,
        problem,
        written.source,
        flags,
        written.dtype,
        calibration=calibration_for(written.target),
        shape=shape,
        seed=seed,
    )
    if not isinstance(result, BenchmarkResult):
        return [
            *claims,
            differs("reverify", name, f"timing refused it: {result.reason}: {result.message}"),
        ]
    return [
        *claims,
        judge_speedup(
            name, recorded.speedup, recorded.iqr_ns / recorded.median_ns, result, recorded.device
        ),
    ]


def judge_speedup(
    name: str,
    recorded: float,
    recorded_spread: float,
    result: BenchmarkResult,
    recorded_device: str,
) -> Claim:
    """Does the new speedup reach the recorded one, within both measurements' spread?"""
    spread = (
        recorded_spread
        + result.kernel.iqr_ns / result.kernel.median_ns
        + result.baseline.iqr_ns / result.baseline.median_ns
    )
    floor = recorded / (1.0 + spread)
    here = calibration_for(result.target).host
    evidence = (
        f"recorded {recorded:.3f}x, re-measured {result.speedup:.3f}x "
        f"({result.kernel.median_ns / 1e6:.3f} ms against {result.baseline_name} "
        f"{result.baseline.median_ns / 1e6:.3f} ms); the spreads allow down to {floor:.3f}x"
    )
    if recorded_device and recorded_device != here:
        return unverifiable(
            "reverify",
            name,
            f"{evidence}; not judged: recorded on {recorded_device}, measured on {here}",
        )
    if result.speedup >= floor:
        return agrees("reverify", name, evidence)
    return differs("reverify", name, f"{evidence}: the claim does not reproduce")
