"""A campaign's best kernels as files that `kfactory check` and a plain compiler take as
they are: a `// kfactory-flags:` line, a provenance line, then the recorded source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from actors.campaign.history import Candidate, History
from actors.campaign.ranking import CampaignBaseline, OwnTime, leaderboard, speedup_over
from gpu_workers.atomic_file import write_atomically

EXTENSIONS = {"cpu": ".c", "cuda": ".cu"}


def ranked(history: History, campaign_id: str) -> list[Candidate]:
    """Timed kernels at the campaign's shape: the best (promoted head to head) first, then
    the others by their own median time (`actors.campaign.ranking.leaderboard`)."""
    return [c for c in leaderboard(history.campaign_candidates(campaign_id)) if c.written]


def kernel_text(candidate: Candidate) -> str:
    written, timed = candidate.written, candidate.benchmark
    assert written is not None and timed is not None
    return (
        f"// kfactory-flags: {' '.join(written.flags)}\n"
        f"// {candidate.candidate_id}: {written.problem} ({written.dtype}) on {written.target}; "
        f"its own timing run: {timed.median_ns / 1e6:.4f} ms median, {timed.speedup:.3f}x over "
        f"{timed.baseline} in that run; template {written.template or written.writer}\n"
        + written.source
    )


def file_name(candidate: Candidate, rank: int | None = None) -> str:
    assert candidate.written is not None
    stem = candidate.candidate_id.replace(":", "-")
    prefix = f"{rank:02d}-" if rank is not None else ""
    return prefix + stem + EXTENSIONS.get(candidate.written.target, ".c")


def write_kernel(candidate: Candidate, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, kernel_text(candidate).encode())
    return path


def describe(
    candidate: Candidate,
    path: Path | None,
    own: OwnTime,
    baseline: CampaignBaseline | None = None,
) -> dict[str, Any]:
    """A kernel's figures: `median_ns` is its own time over every run that timed it
    (`actors.campaign.ranking.own_times`), `run_median_ns` its own run's. With the campaign's
    `baseline`, its speedup over that too."""
    written, timed = candidate.written, candidate.benchmark
    assert written is not None and timed is not None
    return {
        "candidate_id": candidate.candidate_id,
        "template": candidate.proposal.template,
        "params": candidate.proposal.params,
        "flags": written.flags,
        "source_hash": written.source_hash,
        "speedup": timed.speedup,
        "median_ns": own.median_ns,
        "iqr_ns": own.iqr_ns,
        "timing_runs": own.runs,
        "run_median_ns": timed.median_ns,
        "baseline": timed.baseline,
        "baseline_ns": timed.baseline_ns,
        "roofline_fraction": timed.roofline_fraction,
        "q1_ns": timed.q1_ns,
        "q3_ns": timed.q3_ns,
        "head_to_head": msgspec.to_builtins(timed.head_to_head),
        "campaign_baseline": baseline.as_dict() if baseline else None,
        "speedup_vs_campaign_baseline": speedup_over(own, baseline),
        "path": str(path) if path else None,
    }
