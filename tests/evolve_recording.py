"""An evolve campaign of a few generations, written through the real strategy's and
kernel writer's decisions (`tests.evolve_history`), each generation closed as the
librarian closes one: its lessons from `lessons_due`, its best from `best_of`. Only the
verdicts and times are invented: each operator's children gain what `GAINS` says over
their parent (a little more at each later slot), and those of `BREAKS` are rejected.

`tests/recorded/evolve-rule-two.jsonl` is this campaign as a librarian of lesson rule 2
recorded it (before operator lessons): `python -m tests.evolve_recording OUT` on a
checkout of that rule records it again (commit 3de9426).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from actors.campaign.ranking import best_of
from actors.records.audit import lessons_due
from actors.search.strategy import Filled
from eventstore.codec import encode
from eventstore.events import (
    CandidateProposed,
    GenerationClosed,
    GenerationOpened,
    KernelRejected,
    LessonLearned,
)
from tests.evolve_history import SEED, Log

GAINS = {"omp_parallel": 3.0, "omp_simd": 2.0, "chain": 2.5, "compiler_flags": 1.2}
"""What each operator's children gain over their parent (others: 1.1)."""
BREAKS = ("restrict", "unroll")
"""The operators whose children are rejected as wrong (at compare)."""
NAME = "evolve-recorded"


def close(log: Log, generation: int) -> None:
    for lesson in lessons_due(log.history, log.name):
        log.add(
            LessonLearned,
            generation=generation,
            kind=lesson.kind,
            statement=lesson.statement,
            evidence_ids=lesson.evidence_ids,
            data=lesson.data,
        )
    state = log.history.campaigns[log.name].generations[generation]
    members = [log.history.candidates[c] for c in state.candidates]
    best = best_of(members)
    log.add(
        GenerationClosed,
        generation=generation,
        settled=len(members),
        evaluated=sum(1 for c in members if c.evaluated),
        best_candidate=best.candidate_id if best else None,
        best_speedup=best.speedup if best else None,
    )


def seed_generation(log: Log) -> None:
    cid = f"{log.name}:g0:c0"
    log.add(GenerationOpened, generation=0, planned=1)
    log.add(CandidateProposed, template="seed", params={}, param_key="seed:{}", **log.work(cid, 0))
    log.written(cid, 0, SEED, ["-O3"])
    log.timed(cid, 0, 40_000.0)
    close(log, 0)


def operator_generation(log: Log, generation: int, count: int) -> None:
    filled = log.fill(generation, count)
    assert isinstance(filled, Filled), filled
    for slot, proposal in enumerate(log.propose(generation, filled.candidates)):
        log.write(proposal)
        child = log.history.candidates[proposal.candidate_id]
        if child.settled or child.written is None:
            continue  # refused or a duplicate
        if proposal.operator in BREAKS:
            log.add(
                KernelRejected,
                source_hash=child.written.source_hash,
                stage="compare",
                reason="wrong_value",
                evidence={"message": "y[3] is 2.5 where the reference gives 1.5"},
                **log.work(proposal.candidate_id, generation),
            )
            continue
        parent = log.history.candidates[proposal.parents[0]]
        assert parent.benchmark is not None
        gain = GAINS.get(proposal.operator, 1.1) * (1 + 0.03 * slot)
        log.timed(proposal.candidate_id, generation, parent.benchmark.median_ns / gain)
    close(log, generation)


def record_campaign(folder: Path, generations: int = 3, count: int = 6) -> Log:
    log = Log(folder, per_generation=count, name=NAME)
    seed_generation(log)
    for generation in range(1, generations + 1):
        operator_generation(log, generation, count)
    return log


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        recorded = record_campaign(Path(folder))
        Path(sys.argv[1]).write_bytes(b"".join(encode(e) + b"\n" for e in recorded.events))
