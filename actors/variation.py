"""LLM-mode proposals: variation operators over a MAP-Elites archive of the history.

Generation 0 seeds the archive with each template's best known point. Later
generations first ask for fixes of rejected kernels (with their evidence), then
alternate improve(parent) and crossover(a, b), parents drawn across niches (template
family, algorithm, performance band) rather than only the single best.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from actors.history import Candidate
from actors.llm.archive import Archive, ArchiveEntry
from actors.search import Proposal
from kernels.templates import TEMPLATES, templates_for

LLM_TEMPLATE = "llm"


@dataclass(frozen=True)
class Variation:
    operator: str  # improve | fix | crossover
    parents: list[str]
    family: str
    slot: int
    params: dict[str, Any] = field(default_factory=dict)

    def key(self, campaign_id: str, generation: int) -> str:
        return (
            f"{LLM_TEMPLATE}:{campaign_id}:g{generation}:{self.operator}:{','.join(self.parents)}"
        )


def seeds(problem: str, target: str) -> list[Proposal]:
    """Generation 0: every template's best known point, the archive's first residents."""
    return [Proposal(t.name, dict(t.best_known)) for t in templates_for(problem, target)]


def _family(candidate: Candidate, by_id: dict[str, Candidate]) -> tuple[str, str]:
    proposal = candidate.proposal
    if proposal.template in TEMPLATES:
        return proposal.template, TEMPLATES[proposal.template].algorithm
    parent = by_id.get(proposal.parents[0]) if proposal.parents else None
    return _family(parent, by_id) if parent else (LLM_TEMPLATE, LLM_TEMPLATE)


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
