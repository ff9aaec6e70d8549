"""LLM-mode proposals: variation operators over a MAP-Elites archive of the history.

Generation 0 seeds the archive with each seed kernel and each template's best known
point; with neither, the LLM writes generation 0 from the problem alone. Later
generations first ask for fixes of rejected kernels (with their evidence), then
alternate improve(parent) and crossover(a, b), parents drawn across niches (template
family, algorithm, performance band) rather than only the single best.

A kernel that is not a built-in template's point (an LLM's kernel, a seed, a user
template's) gets its niche from its lineage and its source: its family is its lineage's
root (the template it descends from, a seed, a user template, or the blank-page write
that began it), and its algorithm is what its source is built from (`source_traits`:
threads, simd, intrinsics, vector extensions, unrolling; else scalar), so differently
built kernels of one lineage compete in different cells.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from actors.campaign.history import Candidate
from actors.search.llm.archive import Archive, ArchiveEntry
from kernels.templates import TEMPLATES

LLM_TEMPLATE = "llm"
WRITE = "write"
"""The operator of a kernel the LLM writes from the problem alone, with no parent."""
_TRAITS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("threads", re.compile(r"#\s*pragma\s+omp\s+parallel|omp\s+for\b")),
    ("simd", re.compile(r"#\s*pragma\s+(omp\s+simd|GCC\s+ivdep)|\bsimd\b")),
    ("intrinsics", re.compile(r"\b_mm\d*_\w+\(")),
    ("vector-ext", re.compile(r"vector_size\s*\(")),
    ("unrolled", re.compile(r"#\s*pragma\s+(GCC\s+)?unroll")),
)


@dataclass(frozen=True)
class Variation:
    operator: str  # write | improve | fix | crossover
    parents: list[str]
    family: str
    slot: int
    params: dict[str, Any] = field(default_factory=dict)

    def key(self, campaign_id: str, generation: int) -> str:
        origin = ",".join(self.parents) or f"slot{self.slot}"
        return f"{LLM_TEMPLATE}:{campaign_id}:g{generation}:{self.operator}:{origin}"


def blank_page(count: int) -> list[Variation]:
    """Generation 0 with nothing to start from: `count` kernels written from the problem
    alone, each the root of its own family."""
    return [Variation(WRITE, [], f"{WRITE}{slot}", slot) for slot in range(count)]


def source_traits(source: str) -> str:
    """What a kernel's source is built from, for a kernel with no template's algorithm:
    the niche axis that keeps differently built kernels apart."""
    traits = [name for name, pattern in _TRAITS if pattern.search(source)]
    return "+".join(traits) or "scalar"


def _family(candidate: Candidate, by_id: dict[str, Candidate]) -> tuple[str, str]:
    """(family, algorithm): a template's name and algorithm; for an LLM kernel its
    lineage's root (a template, a seed, or a blank-page write) and its source's traits."""
    proposal = candidate.proposal
    if proposal.template in TEMPLATES:
        return proposal.template, TEMPLATES[proposal.template].algorithm
    traits = source_traits(candidate.written.source if candidate.written else "")
    if proposal.template != LLM_TEMPLATE:
        return proposal.template, traits
    parent = by_id.get(proposal.parents[0]) if proposal.parents else None
    if parent is None:
        return str(proposal.params.get("family", LLM_TEMPLATE)), traits
    return _family(parent, by_id)[0], traits


def archive_of(candidates: list[Candidate]) -> Archive:
    by_id = {c.candidate_id: c for c in candidates}
    archive = Archive()
    for c in candidates:
        if c.written is None or not c.settled or c.duplicate:
            continue
        family, algorithm = _family(c, by_id)
        archive.add(
            ArchiveEntry(
                candidate_id=c.candidate_id,
                source_hash=c.written.source_hash,
                family=family,
                algorithm=algorithm,
                speedup=c.speedup,
                source=c.written.source,
            )
        )
    return archive


def variations(
    candidates: list[Candidate], count: int, generation: int, seed: int
) -> list[Variation]:
    archive = archive_of(candidates)
    rng = random.Random(seed * 104_729 + generation)
    fixed = {p for c in candidates if c.proposal.operator == "fix" for p in c.proposal.parents}
    chosen: list[Variation] = []
    to_fix = [e for e in archive.rejected() if e.candidate_id not in fixed]
    for entry in to_fix[: max(1, count // 2)]:
        chosen.append(Variation("fix", [entry.candidate_id], entry.family, len(chosen)))
    while len(chosen) < count:
        pair = archive.select_pair(rng) if len(chosen) % 2 else None
        if pair is not None:
            a, b = pair
            chosen.append(
                Variation("crossover", [a.candidate_id, b.candidate_id], a.family, len(chosen))
            )
            continue
        parents = archive.select_parents(rng, 1)
        if not parents:
            break
        chosen.append(
            Variation("improve", [parents[0].candidate_id], parents[0].family, len(chosen))
        )
    return chosen
