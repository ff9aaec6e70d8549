"""A campaign's search replayed against a design space measured once (`space_table.py`):
the planner's own `TemplateSearch` proposes generation by generation, and each proposal's
outcome is the table's, recorded as the events the swarm would have recorded (a timed
kernel's speedup, shape and device; a rejection's stage). Nothing is timed here, so a
search can be replayed for many seeds.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from actors.campaign.history import Candidate  # noqa: E402
from actors.search.template_search import Proposal, TemplateSearch  # noqa: E402
from eventstore.events import (  # noqa: E402
    ActorRef,
    BenchmarkCompleted,
    CandidateProposed,
    KernelRejected,
    new_event,
)
from kernels.design_space import Template  # noqa: E402
from kernels.templates import TEMPLATES  # noqa: E402

ACTOR = ActorRef.here("bench")


@dataclass(frozen=True)
class Measured:
    """One shape's column of a table: each point's figure (None: rejected, with stage)."""

    shape: tuple[int, ...]
    ratio: dict[str, float | None]
    stage: dict[str, str]
    params: dict[str, tuple[str, dict[str, Any]]]
    device: str

    @property
    def best(self) -> float:
        return max(r for r in self.ratio.values() if r is not None)

    def reached(self, key: str, fraction: float) -> bool:
        value = self.ratio[key]
        return value is not None and value >= fraction * self.best


OBJECTIVES = ("ratio", "own-time")
"""ratio: the reference point's median over the point's, timed in the same rounds;
own-time: 1 ms over the point's own median (no reference, so no reference noise)."""


def replay_arguments(parser: argparse.ArgumentParser) -> None:
    """The options both replayed figures take (search efficiency, self-improvement)."""
    parser.add_argument("--problem", default="softmax")
    parser.add_argument("--template", default="softmax_rows")
    parser.add_argument("--per-generation", type=int, default=8)
    parser.add_argument("--fraction", type=float, default=0.95)
    parser.add_argument(
        "--objective", choices=OBJECTIVES, default="ratio", help="which figure of the table"
    )


def table_facts(
    table: dict[str, Any], table_file: Path, root: Path, objective: str, load_before: Any
) -> dict[str, Any]:
    """What a replayed figure's report says of the table it replayed against."""
    return {
        "templates": table["templates"],
        "host": table["host"],
        "table": str(table_file.relative_to(root)),
        "objective": objective,
        "table_objective": table["objective"],
        "measured_load_average": [table["load_average_before"], table["load_average_after"]],
        "replay_load_average": [load_before, os.getloadavg()],
    }


def column(table: dict[str, Any], shape: str, objective: str = "ratio") -> Measured:
    ratio: dict[str, float | None] = {}
    stage: dict[str, str] = {}
    params: dict[str, tuple[str, dict[str, Any]]] = {}
    for row in table["points"]:
        at = row["at"][shape]
        if at["ratio"] is None or objective == "ratio":
            ratio[row["key"]] = at["ratio"]
        else:
            ratio[row["key"]] = 1e6 / at["median_ns"]
        if at["ratio"] is None:
            stage[row["key"]] = at["stage"]
        params[row["key"]] = (row["template"], row["params"])
    extents = tuple(int(v) for v in shape.split("x"))
    return Measured(extents, ratio, stage, params, table["host"])


def spaces_of(table: dict[str, Any]) -> list[Template]:
    return [TEMPLATES[name] for name in table["templates"]]


@dataclass
class Campaign:
    """A replayed campaign: its id, where it is timed and what it settled, in order."""

    campaign_id: str
    measured: Measured
    settled: list[Candidate] = field(default_factory=list)

    def record(self, proposal: Proposal, generation: int) -> Candidate:
        common: dict[str, Any] = {
            "campaign_id": self.campaign_id,
            "actor": ACTOR,
            "problem": "replayed",
            "target": "cpu",
            "candidate_id": f"{self.campaign_id}:g{generation}:c{len(self.settled)}",
            "generation": generation,
        }
        proposed = new_event(
            CandidateProposed,
            template=proposal.template,
            params=proposal.params,
            param_key=proposal.key,
            **common,
        )
        ratio = self.measured.ratio[proposal.key]
        if ratio is None:
            rejected = new_event(
                KernelRejected,
                source_hash="",
                stage=self.measured.stage[proposal.key],
                reason="replayed",
                **common,
            )
            candidate = Candidate(proposal=proposed, rejected=rejected)
        else:
            timed = new_event(
                BenchmarkCompleted,
                source_hash="",
                median_ns=1e6 / ratio,
                iqr_ns=0.0,
                baseline="reference point",
                baseline_ns=1e6,
                speedup=ratio,
                roofline_fraction=0.0,
                device=self.measured.device,
                shape=dict(zip(("rows", "cols"), self.measured.shape, strict=True)),
                **common,
            )
            candidate = Candidate(proposal=proposed, benchmark=timed)
        self.settled.append(candidate)
        return candidate


def search(
    campaign: Campaign,
    spaces: list[Template],
    seed: int,
    *,
    earlier: Sequence[Candidate] = (),
    per_generation: int = 8,
    budget: int | None = None,
    stop_at: float | None = None,
) -> int | None:
    """Run the planner's search for `campaign` with `earlier` campaigns' candidates in the
    history, until `budget` evaluations or (with `stop_at`) one reaches that fraction of
    the table's best. Returns the evaluations it took to reach it (None: never)."""
    searcher = TemplateSearch(spaces, seed)
    total = len(campaign.measured.ratio)
    budget = min(budget or total, total)
    reached: int | None = None
    generation = 0
    seen: set[str] = set()

    def taken(proposal: Proposal) -> bool:
        return proposal.key in seen

    while len(campaign.settled) < budget:
        proposals = searcher.propose(
            [*earlier, *campaign.settled],
            min(per_generation, budget - len(campaign.settled)),
            generation,
            taken,
            campaign_id=campaign.campaign_id,
            shape=campaign.measured.shape,
        )
        if not proposals:
            break
        for proposal in proposals:
            campaign.record(proposal, generation)
            seen.add(proposal.key)
            if (
                reached is None
                and stop_at is not None
                and campaign.measured.reached(proposal.key, stop_at)
            ):
                reached = len(campaign.settled)
        if reached is not None:
            break
        generation += 1
    return reached


def random_search(measured: Measured, fraction: float, seed: int) -> int:
    order = sorted(measured.ratio)
    random.Random(seed).shuffle(order)
    return next(i for i, key in enumerate(order, 1) if measured.reached(key, fraction))
