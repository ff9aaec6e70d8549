"""Replay and audit figures on a large campaign: prints a table, writes
bench/results/audit_replay.json.

Usage:
  .venv/bin/python bench/audit_replay.py                       # 100,000 events
  .venv/bin/python bench/audit_replay.py --events 20000 --per-generation 32

The campaign is recorded into a fresh DuckDB store the way the swarm records one (the
same event types, causes, hash chain and positions), with its derived facts computed by
the same code the actors run: each generation's lessons (`draw_lessons`), its close and
the final summary. Only the measurements are invented (speedups drawn from a seeded
random model of the parameters), so no kernel is compiled. The figures are the wall time
of the real commands, `kfactory replay C --json` and `kfactory audit C --json` (no
--reverify), each in a fresh process, best of --repeat.

With --operators SHARE, that share of the candidates are variation operators' children
of an earlier timed kernel (an offline operator and a point of its space, a gain over
the parent drawn per operator), timed at a shape, so that each generation's lessons
include the operator lessons of their family: `--operators 0.5` measures the audit with
them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from actors.campaign.campaign_file import Budget, CampaignSpec, Search
from actors.campaign.history import History, param_key
from actors.campaign.ranking import best_of
from actors.campaign.summary import summary
from actors.records.audit import lessons_due
from actors.search.lineage import EVOLVE_TEMPLATE
from actors.search.operators.registry import OPERATORS
from eventstore.codec import encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.events import (
    SYSTEM_CAMPAIGN,
    ActorRef,
    BenchmarkCompleted,
    CampaignFinished,
    CampaignStarted,
    CandidateDeduplicated,
    CandidateProposed,
    Event,
    GenerationClosed,
    GenerationOpened,
    HostCalibrated,
    KernelRejected,
    KernelVerified,
    KernelWritten,
    LessonLearned,
    new_event,
)
from eventstore.ids import derived_event_id
from eventstore.store import Recorded
from kernels.identity import source_hash

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
KFACTORY = [sys.executable, "-m", "ops.cli"]
CAMPAIGN = "bench-audit"
SPACE: dict[str, list[Any]] = {  # the size of a real template's space (softmax: 7 params)
    "tile": [16, 32, 64, 128],
    "unroll": [1, 2, 4, 8],
    "threads": [0, 1, 2, 4],
    "simdlen": [4, 8, 16],
    "schedule": ["static", "dynamic"],
    "prefetch": [0, 256, 1024],
    "streaming": [False, True],
}
TEMPLATES = ("rows_a", "rows_b", "rows_c")
SHAPE = {"rows": 512, "cols": 2048}


def actor(role: str) -> ActorRef:
    return ActorRef(role=role, instance=f"{role}-0", host="bench-host")


class Recorder:
    """Appends events to the store in batches, and applies them to a history as it goes."""

    def __init__(self, store: DuckDBEventStore) -> None:
        self.store = store
        self.history = History()
        self.pending: list[Recorded] = []
        self.count = 0

    def emit(self, event: Event) -> Event:
        self.count += 1
        self.history.apply(self.count, event)
        self.pending.append(Recorded(event, encode(event)))
        if len(self.pending) >= 5_000:
            self.flush()
        return event

    def flush(self) -> None:
        self.store.append(self.pending)
        self.pending = []


def record_campaign(
    path: Path, events: int, per_generation: int, seed: int, operators: float = 0.0
) -> int:
    rng = random.Random(seed)
    store = DuckDBEventStore(path)
    out = Recorder(store)
    budget = events  # never the reason to stop: the event count is
    spec = CampaignSpec(
        problem="softmax",
        target="cpu",
        budget=Budget(candidates=budget, wall_time="100d"),
        search=Search(per_generation=per_generation, seed=seed),
    )
    start = out.emit(
        new_event(
            CampaignStarted,
            campaign_id=CAMPAIGN,
            actor=actor("cli"),
            name=CAMPAIGN,
            problem="softmax",
            target="cpu",
            config=spec.to_config(),
        )
    )
    out.emit(  # the device the benchmarks name, calibrated as the benchmarker does first
        new_event(
            HostCalibrated,
            campaign_id=SYSTEM_CAMPAIGN,
            actor=actor("benchmarker"),
            device="bench-host",
            bandwidth_gbs=20.0,
            peak_gflops=200.0,
        )
    )
    sources: list[tuple[str, Event]] = []  # (source, the event that settled it)
    timed: list[tuple[str, float]] = []  # (candidate id, median) of the timed kernels
    generation = 0
    while out.count < events:
        opened = out.emit(
            new_event(
                GenerationOpened,
                campaign_id=CAMPAIGN,
                actor=actor("planner"),
                cause=start,
                generation=generation,
                planned=per_generation,
            )
        )
        for index in range(per_generation):
            _candidate(out, rng, opened, generation, index, sources, timed, operators)
        lessons = lessons_due(out.history, CAMPAIGN)
        for number, lesson in enumerate(lessons):
            out.emit(
                new_event(
                    LessonLearned,
                    campaign_id=CAMPAIGN,
                    actor=actor("librarian"),
                    cause=opened,
                    event_id=derived_event_id(opened.event_id, "lesson", number, key=b""),
                    generation=generation,
                    kind=lesson.kind,
                    statement=lesson.statement,
                    evidence_ids=lesson.evidence_ids,
                    data=lesson.data,
                )
            )
        state = out.history.campaigns[CAMPAIGN].generations[generation]
        members = [out.history.candidates[c] for c in state.candidates]
        best = best_of(members)  # as the librarian closes a generation
        out.emit(
            new_event(
                GenerationClosed,
                campaign_id=CAMPAIGN,
                actor=actor("librarian"),
                cause=opened,
                event_id=derived_event_id(opened.event_id, "closed", key=b""),
                generation=generation,
                settled=len(members),
                evaluated=sum(1 for c in members if c.evaluated),
                best_candidate=best.candidate_id if best else None,
                best_speedup=best.speedup if best else None,
            )
        )
        generation += 1
    campaign = out.history.campaigns[CAMPAIGN]
    out.emit(
        new_event(
            CampaignFinished,
            campaign_id=CAMPAIGN,
            actor=actor("planner"),
            cause=start,
            reason="nothing new to try in the design space",
            summary=summary(out.history, campaign),
        )
    )
    out.flush()
    total = store.last_position
    store.close()
    return total


def _candidate(
    out: Recorder,
    rng: random.Random,
    opened: Event,
    generation: int,
    index: int,
    sources: list[tuple[str, Event]],
    timed: list[tuple[str, float]],
    operators: float,
) -> None:
    template = rng.choice(TEMPLATES)
    params: dict[str, Any] = {name: rng.choice(values) for name, values in SPACE.items()}
    operator, parents, parent_median = "sample", [], 0.0
    if operators and timed and rng.random() < operators:
        template, operator = EVOLVE_TEMPLATE, rng.choice(sorted(OPERATORS))
        space = OPERATORS[operator].space()
        params = {name: rng.choice(values) for name, values in sorted(space.items())}
        parent, parent_median = rng.choice(timed)
        parents = [parent]
    work: dict[str, Any] = {
        "problem": "softmax",
        "target": "cpu",
        "candidate_id": f"{CAMPAIGN}:g{generation}:c{index}",
        "generation": generation,
    }
    proposed = out.emit(
        new_event(
            CandidateProposed,
            campaign_id=CAMPAIGN,
            actor=actor("planner"),
            cause=opened,
            template=template,
            params=params,
            param_key=param_key(template, params),
            operator=operator,
            parents=parents,
            **work,
        )
    )
    if sources and rng.random() < 0.05:  # the writer produced a kernel settled before
        source, settled = rng.choice(sources)
        out.emit(
            new_event(
                CandidateDeduplicated,
                campaign_id=CAMPAIGN,
                actor=actor("kernel-writer"),
                cause=proposed,
                source_hash=source_hash(source, ["-O3"]),
                param_key=param_key(template, params),
                duplicate_of=settled.event_id,
                **work,
            )
        )
        return
    source = f"// {work['candidate_id']}: {template} {params}\nvoid kernel(void) {{}}\n"
    identity = source_hash(source, ["-O3"])
    written = out.emit(
        new_event(
            KernelWritten,
            campaign_id=CAMPAIGN,
            actor=actor("kernel-writer"),
            cause=proposed,
            source_hash=identity,
            source=source,
            flags=["-O3"],
            writer="operator" if parents else "template",
            template=template,
            params=params,
            param_key=param_key(template, params),
            operator=operator if parents else "",
            parents=parents,
            **work,
        )
    )
    outcome: Event
    if (params.get("tile") == 128 and params.get("unroll") == 8) or rng.random() < 0.3:
        outcome = out.emit(
            new_event(
                KernelRejected,
                campaign_id=CAMPAIGN,
                actor=actor("verifier"),
                cause=written,
                source_hash=identity,
                stage=rng.choice(["compile", "run", "compare"]),
                reason=rng.choice(["spills", "timeout", "mismatch"]),
                evidence={"message": f"element {rng.randrange(4096)} differs"},
                **work,
            )
        )
    else:
        verified = out.emit(
            new_event(
                KernelVerified,
                campaign_id=CAMPAIGN,
                actor=actor("verifier"),
                cause=written,
                source_hash=identity,
                max_rel_err=1e-7,
                trials=20,
                **work,
            )
        )
        if parents:  # each operator's own mean gain over the parent, from -0.2 to +0.5
            gain = 0.7 * sorted(OPERATORS).index(operator) / len(OPERATORS) - 0.2
            median = parent_median / math.exp(gain + rng.gauss(0, 0.2))
        else:
            median = 4e6 / math.exp(
                0.3 * math.log2(params["tile"] / 16)
                - 0.1 * params["unroll"]
                + 0.2 * params["threads"]
                + rng.gauss(0, 0.2)
            )
        outcome = out.emit(
            new_event(
                BenchmarkCompleted,
                campaign_id=CAMPAIGN,
                actor=actor("benchmarker"),
                cause=verified,
                source_hash=identity,
                median_ns=median,
                iqr_ns=median * 0.03,
                baseline="numpy float32",
                baseline_ns=4e6,
                speedup=4e6 / median,
                roofline_fraction=1e6 / median,
                device="bench-host",
                roofline_ns=1e6,
                shape=SHAPE if operators else {},
                **work,
            )
        )
    sources.append((source, outcome))
    if isinstance(outcome, BenchmarkCompleted):
        timed.append((work["candidate_id"], outcome.median_ns))


def timed(args: list[str], repeat: int) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Best wall and CPU seconds (user + system) of a command over `repeat` runs."""
    best_wall = best_cpu = math.inf
    done: subprocess.CompletedProcess[str] | None = None
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        done = subprocess.run([*KFACTORY, *args], capture_output=True, text=True, cwd=ROOT)
        best_wall = min(best_wall, time.perf_counter() - began)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        best_cpu = min(best_cpu, cpu)
    assert done is not None
    return best_wall, best_cpu, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--per-generation", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--operators", type=float, default=0.0, help="the share of operator children"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kf-bench-audit-") as tmp:
        home = Path(tmp)
        began = time.perf_counter()
        stored = record_campaign(
            home / "events.duckdb", args.events, args.per_generation, args.seed, args.operators
        )
        setup = time.perf_counter() - began
        startup_s, startup_cpu, _ = timed(["--help"], args.repeat)
        replay_s, replay_cpu, replayed = timed(
            ["replay", CAMPAIGN, "--home", str(home), "--json"], args.repeat
        )
        if replayed.returncode != 0:
            raise SystemExit(f"replay failed: {replayed.stderr}")
        audit_s, audit_cpu, audited = timed(
            ["audit", CAMPAIGN, "--home", str(home), "--json"], args.repeat
        )
        report = json.loads(audited.stdout)
    story = json.loads(replayed.stdout)
    differing = [c for c in report["claims"] if c["status"] == "differs"]
    results = {
        "events": stored,
        "candidates": story["proposed"],
        "generations": len(story["generations"]),
        "lessons": len(story["lessons"]),
        "operator_share": args.operators,
        "operator_lessons": sum(1 for x in story["lessons"] if x["kind"] == "operator"),
        "per_generation": args.per_generation,
        "record_seconds": setup,
        "cli_startup_seconds": startup_s,
        "cli_startup_cpu_seconds": startup_cpu,
        "replay_seconds": replay_s,
        "replay_cpu_seconds": replay_cpu,
        "audit_seconds": audit_s,
        "audit_cpu_seconds": audit_cpu,
        "load_average_1min": os.getloadavg()[0],
        "audit_claims_differing": len(differing),
        "audit_exit": audited.returncode,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "audit_replay.json"
    out.write_text(json.dumps(results, indent=2))
    width = max(map(len, results))
    for key, value in results.items():
        shown = f"{value:,.2f}" if isinstance(value, float) else f"{value:,}"
        print(f"{key:<{width}}  {shown}")
    if differing:
        print("claims that differ (a bench store should agree everywhere):")
        for claim in differing[:5]:
            print(f"  {claim}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
