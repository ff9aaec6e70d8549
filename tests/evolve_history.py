"""A small evolve campaign's history written by hand, for the decision tests of the evolve
strategy and the kernel writer's operators: a user problem (y = x / 2 + 1 over rows) in a
temp folder, its plain scalar seed verified and timed in generation 0. Two other user
problems, for the tests of what carries over a problem family: another row-wise operation
(y = 3 - x over rows, the same family) and an element-wise one (y = x / 2 + 1 over n)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from actors.campaign.campaign_file import Budget, CampaignSpec, Search, Seed, Writer
from actors.campaign.history import History
from actors.roles.kernel_writer import decide_operator
from actors.runtime import Reactions
from actors.search.evolve_strategy import EvolveStrategy
from actors.search.lineage import context_for
from actors.search.strategy import Filled, GenerationInputs, Planned, Stalled
from eventstore.events import (
    ActorRef,
    BenchmarkCompleted,
    CampaignStarted,
    CandidateProposed,
    Event,
    GenerationClosed,
    GenerationOpened,
    KernelVerified,
    KernelWritten,
)
from kernels.identity import source_hash

PROBLEM = """
import numpy as np
from kernels.spec import Arg, Cost, Problem


def _scale(a):
    return {"y": a["x"].astype(np.float64) * 0.5 + 1.0}


def _numpy(a):
    return {"y": a["x"] * np.float32(0.5) + np.float32(1.0)}


ROWSCALE = Problem(
    name="rowscale",
    description="y = x / 2 + 1, row by row",
    dims=("rows", "cols"),
    args=(Arg("x", ("rows", "cols")), Arg("y", ("rows", "cols"), output=True)),
    reference=_scale,
    baseline=_numpy,
    test_shapes=({"rows": 3, "cols": 37}, {"rows": 1, "cols": 1}, {"rows": 5, "cols": 64}),
    default_shape={"rows": 64, "cols": 512},
    cost=lambda s: Cost(bytes_moved=8 * s["rows"] * s["cols"], flops=2 * s["rows"] * s["cols"]),
)
"""

SEED = """\
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
            y[r * cols + j] = x[r * cols + j] * 0.5f + 1.0f;
        }
    }
}
"""

ROWFLIP_PROBLEM = (
    PROBLEM.replace("ROWSCALE", "ROWFLIP")
    .replace('"rowscale"', '"rowflip"')
    .replace("y = x / 2 + 1", "y = 3 - x")
    .replace('a["x"].astype(np.float64) * 0.5 + 1.0', '3.0 - a["x"].astype(np.float64)')
    .replace('a["x"] * np.float32(0.5) + np.float32(1.0)', 'np.float32(3.0) - a["x"]')
)

ROWFLIP_SEED = SEED.replace("x[r * cols + j] * 0.5f + 1.0f", "3.0f - x[r * cols + j]")

VECSCALE_PROBLEM = """
import numpy as np
from kernels.spec import Arg, Cost, Problem


def _scale(a):
    return {"y": a["x"].astype(np.float64) * 0.5 + 1.0}


def _numpy(a):
    return {"y": a["x"] * np.float32(0.5) + np.float32(1.0)}


VECSCALE = Problem(
    name="vecscale",
    description="y = x / 2 + 1, element by element",
    dims=("n",),
    args=(Arg("x", ("n",)), Arg("y", ("n",), output=True)),
    reference=_scale,
    baseline=_numpy,
    test_shapes=({"n": 37}, {"n": 1}, {"n": 320}),
    default_shape={"n": 32768},
    cost=lambda s: Cost(bytes_moved=8 * s["n"], flops=2 * s["n"]),
)
"""

VECSCALE_SEED = """\
#include <stdint.h>
void kernel(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        y[i] = x[i] * 0.5f + 1.0f;
    }
}
"""


@dataclass(frozen=True)
class UserProblem:
    """A problem file, its object's name, its seed and the names of its dimensions."""

    file: str
    name: str
    text: str
    seed: str
    dims: tuple[str, ...]


ROWSCALE = UserProblem("rowscale.py", "ROWSCALE", PROBLEM, SEED, ("rows", "cols"))
ROWFLIP = UserProblem("rowflip.py", "ROWFLIP", ROWFLIP_PROBLEM, ROWFLIP_SEED, ("rows", "cols"))
VECSCALE = UserProblem("vecscale.py", "VECSCALE", VECSCALE_PROBLEM, VECSCALE_SEED, ("n",))

ACTOR = ActorRef("test", "test-0", "test")
HOST = "test-host"
"""The device every kernel is timed on."""
CAMPAIGN = "evolve-test"


def write_problem(folder: Path, problem: UserProblem = ROWSCALE) -> tuple[str, Path]:
    """The problem (`path.py:NAME`) and the seed's file, written into `folder`."""
    (folder / problem.file).write_text(problem.text)
    seed = folder / f"{problem.file.removesuffix('.py')}-seed.c"
    seed.write_text(problem.seed)
    return f"{folder / problem.file}:{problem.name}", seed


class Log:
    """Events of one campaign, applied to a History as they are made (`then` starts another
    campaign in the same history)."""

    def __init__(
        self,
        folder: Path,
        per_generation: int = 4,
        name: str = CAMPAIGN,
        shape: tuple[int, ...] = (64, 512),
        history: History | None = None,
        events: list[Event] | None = None,
        writer: Writer | None = None,
        problem_files: UserProblem = ROWSCALE,
    ) -> None:
        problem, seed = write_problem(folder, problem_files)
        self.problem_files = problem_files
        self.name = name
        self.spec = CampaignSpec(
            problem=problem,
            name=name,
            shapes=[list(shape)],
            budget=Budget(candidates=40),
            writer=writer or Writer(kind="evolve"),
            search=Search(per_generation=per_generation, seed=3),
            seed=Seed(sources=[str(seed)]),
        )
        self.history = history or History()
        self.events: list[Event] = events if events is not None else []
        self.started = self.add(
            CampaignStarted,
            name=name,
            problem=problem,
            target="cpu",
            config=self.spec.to_config(),
        )

    def add(self, cls: type[Any], **payload: Any) -> Any:
        event = cls(
            event_id=f"e{len(self.events)}",
            campaign_id=self.name,
            schema=cls.SCHEMA,
            actor=ACTOR,
            ts=datetime(2026, 1, 1, tzinfo=UTC),
            **payload,
        )
        self.events.append(event)
        self.history.apply(len(self.events), event)
        return event

    def work(self, candidate_id: str, generation: int) -> dict[str, Any]:
        return {
            "problem": self.spec.problem,
            "target": "cpu",
            "candidate_id": candidate_id,
            "generation": generation,
        }

    def timed_seed(self, median_ns: float = 40_000.0) -> str:
        """Generation 0: the seed as it is, written, verified, timed, closed."""
        cid = f"{self.name}:g0:c0"
        self.add(GenerationOpened, generation=0, planned=1)
        self.add(
            CandidateProposed, template="seed", params={}, param_key="seed:{}", **self.work(cid, 0)
        )
        self.written(cid, 0, self.problem_files.seed, ["-O3"])
        self.timed(cid, 0, median_ns)
        self.add(GenerationClosed, generation=0, settled=1, evaluated=1)
        return cid

    def written(
        self, cid: str, generation: int, source: str, flags: list[str], **extra: Any
    ) -> None:
        digest = source_hash(source, flags)
        self.add(
            KernelWritten,
            source_hash=digest,
            source=source,
            flags=flags,
            writer="template",
            **extra,
            **self.work(cid, generation),
        )

    def then(
        self, name: str, shape: tuple[int, ...], problem_files: UserProblem | None = None
    ) -> Log:
        """Another campaign, of the same problem or of `problem_files`, started in this
        history."""
        folder = Path(self.spec.problem.rpartition(":")[0]).parent
        return Log(
            folder,
            name=name,
            shape=shape,
            history=self.history,
            events=self.events,
            problem_files=problem_files or self.problem_files,
        )

    def fill(self, generation: int, count: int = 4) -> Filled | Stalled:
        """What the evolve strategy fills `generation` with, from the history so far."""
        strategy = EvolveStrategy()
        campaign = self.history.campaigns[self.name]
        inputs = GenerationInputs(count, [], strategy.first_points(self.spec), frozenset(), [])
        return strategy.fill(self.history, campaign, generation, inputs)

    def propose(
        self, generation: int, planned: list[Planned], opened: int | None = None
    ) -> list[CandidateProposed]:
        """The candidates proposed, numbered from 0 (opening the generation for `opened`)."""
        self.add(GenerationOpened, generation=generation, planned=opened or len(planned))
        return [
            self.add(
                CandidateProposed,
                template=p.template,
                params=p.params,
                param_key=p.param_key,
                operator=p.operator,
                parents=p.parents,
                **self.work(f"{self.name}:g{generation}:c{i}", generation),
            )
            for i, p in enumerate(planned)
        ]

    def write(self, proposal: CandidateProposed) -> list[Event]:
        """What the kernel writer decides for an operator proposal, applied."""
        out = Reactions(proposal, ACTOR)
        decide_operator(self.history, proposal, out, context_for(self.spec))
        for event in out.events:
            self.events.append(event)
            self.history.apply(len(self.events), event)
        return list(out.events)

    def timed(self, cid: str, generation: int, median_ns: float) -> None:
        digest = self.history.candidates[cid].written.source_hash  # type: ignore[union-attr]
        self.add(
            KernelVerified,
            source_hash=digest,
            max_rel_err=0.0,
            trials=3,
            **self.work(cid, generation),
        )
        self.add(
            BenchmarkCompleted,
            source_hash=digest,
            median_ns=median_ns,
            iqr_ns=1.0,
            baseline="numpy",
            baseline_ns=50_000.0,
            speedup=50_000.0 / median_ns,
            roofline_fraction=0.1,
            device=HOST,
            shape=dict(zip(self.problem_files.dims, self.spec.shapes[0], strict=True)),
            **self.work(cid, generation),
        )
