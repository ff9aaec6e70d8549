"""A campaign's best kernels as files that `kfactory check` and a plain compiler take as
they are: a `// kfactory-flags:` line (the flags it was built with when verified and
timed: `Target.built_flags`), a provenance line, then the recorded source.

`kfactory best` writes them in leaderboard order (`ranked`: the best first, then the
others by own time); `kfactory run` writes the winner to `<home>/best/`. A kernel a
variation operator wrote carries its lineage too: a comment line per operator step from
its root (the operator, its parameters, the parents it varied). A file is named after its
candidate id (`.c` for cpu, `.cu` for cuda); its provenance line gives the kernel's
figure (`actors.campaign.leaderboard.figure_of`), as every view does, and a `// verified
on:` line the shapes a check of its problem verifies on (`Problem.envelope`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from actors.campaign.history import Candidate
from actors.campaign.leaderboard import Row, figure_of
from actors.campaign.ranking import CampaignBaseline
from actors.search.operators.protocol import Step
from eventstore.events import FinalContender
from gpu_workers.atomic_file import write_atomically
from gpu_workers.targets import target_of
from kernels.loading import ProblemLoadError, load_problem


def kernel_text(candidate: Candidate, lineage: Sequence[Step] = ()) -> str:
    """The file's text; with `lineage` (the operator steps from its root), a comment line
    per step: the operator, its parameters and the parents it varied."""
    written, timed = candidate.written, candidate.benchmark
    assert written is not None and timed is not None
    figure = figure_of(timed)
    return (
        f"// kfactory-flags: {' '.join(built_flags(candidate))}\n"
        f"// {candidate.candidate_id}: {written.problem} ({written.dtype}) on {written.target}; "
        f"{figure.median_ns / 1e6:.4f} ms median (IQR {figure.iqr_ns / 1e6:.4f} ms), "
        f"{figure.speedup:.2f}x over {timed.baseline} in the same run; "
        f"template {written.template or written.writer}\n"
        + envelope_comment(written.problem)
        + lineage_comment(lineage)
        + written.source
    )


def built_flags(candidate: Candidate) -> tuple[str, ...]:
    """The flags the kernel was built with when it was verified and timed."""
    written = candidate.written
    assert written is not None
    return target_of(written.target).built_flags(tuple(written.flags))


def envelope_comment(problem: str) -> str:
    """`// verified on:` the shapes a check of the problem verifies on (its spec's
    envelope), or why they cannot be told here."""
    try:
        envelope = load_problem(problem).envelope
    except ProblemLoadError as exc:
        return f"// verified on: unknown here ({exc})\n"
    return f"// verified on: {envelope or 'the problem states no envelope'}\n"


def lineage_comment(lineage: Sequence[Step]) -> str:
    """`// lineage:` and one line per operator step, earliest first; empty for a root."""
    if not lineage:
        return ""
    lines = [f"// lineage: {len(lineage)} operator step(s) from {lineage[0].parents[0]}\n"]
    for number, step in enumerate(lineage, 1):
        params = ", ".join(f"{name}={value}" for name, value in step.params) or "defaults"
        lines.append(f"//   {number}. {step.operator}({params}) of {' x '.join(step.parents)}\n")
    return "".join(lines)


def file_name(candidate: Candidate, rank: int | None = None) -> str:
    assert candidate.written is not None
    stem = candidate.candidate_id.replace(":", "-")
    prefix = f"{rank:02d}-" if rank is not None else ""
    return prefix + stem + target_of(candidate.written.target).source_suffix


def write_kernel(candidate: Candidate, path: Path, lineage: Sequence[Step] = ()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, kernel_text(candidate, lineage).encode())
    return path


def describe(row: Row, path: Path | None, baseline: CampaignBaseline | None) -> dict[str, Any]:
    """A leaderboard row's figure (`median_ns`, `iqr_ns`, `speedup`: its own run's), and
    the ranking's, named for what they are: `pooled_median_ns` over every run that timed
    it, the campaign's `baseline` and the speedup over that; how its rank was decided, and
    its figures in the final run that placed it. Its `flags` are those it was built with
    (`built_flags`), as the file's flags line names them."""
    return {
        "candidate_id": row.candidate_id,
        "template": row.template,
        "params": row.params,
        "flags": list(built_flags(row.candidate)),
        "source_hash": row.source_hash,
        "speedup": row.speedup,
        "median_ns": row.median_ns,
        "iqr_ns": row.iqr_ns,
        "timing_runs": row.runs,
        "pooled_median_ns": row.pooled_median_ns,
        "baseline": row.timed.baseline,
        "baseline_ns": row.timed.baseline_ns,
        "roofline_fraction": row.roofline_fraction,
        "q1_ns": row.q1_ns,
        "q3_ns": row.q3_ns,
        "head_to_head": msgspec.to_builtins(row.head_to_head),
        "campaign_baseline": baseline.as_dict() if baseline else None,
        "speedup_vs_campaign_baseline": row.speedup_vs_campaign_baseline,
        "decided_by": row.decided_by,
        "final_run": None if row.final is None else final_figures(row.final),
        "path": str(path) if path else None,
    }


def final_figures(final: FinalContender) -> dict[str, Any]:
    """A kernel's figures in the campaign's final run: its mean, median and IQR over that
    run's rounds."""
    return {
        "mean_ns": final.mean_ns,
        "median_ns": final.median_ns,
        "iqr_ns": final.iqr_ns,
        "rounds": final.rounds,
    }
