"""Campaigns that cannot go on say so, and ones that can finish: against a real
nats-server, recorder and DuckDB, with real actors (one of them broken or stopped)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from actors.campaign.campaign_file import Budget, CampaignSpec, Search
from actors.roles.registry import ROLES
from actors.runtime import Actor, ActorRuntime, Reactions
from bus.auth import ClientAuth
from bus.connection import Client, connect
from eventstore.events import CandidateProposed, Event
from eventstore.queries import replay
from ops.hub import Hub
from ops.run_cmd import follow_campaign

SETTLING = ("KernelRejected", "BenchmarkCompleted", "CandidateDeduplicated", "DeadLettered")

USER_PROBLEM = """
import numpy as np
from kernels.spec import Arg, Cost, Problem

def _swiglu(i):
    a, b = i["a"], i["b"]
    return {"y": a / (1 + np.exp(-a)) * b}

SWIGLU = Problem(
    name="swiglu", description="silu(a) * b", dims=("n",),
    args=(Arg("a", ("n",)), Arg("b", ("n",)), Arg("y", ("n",), output=True)),
    reference=_swiglu, baseline=_swiglu,
    test_shapes=({"n": 1}, {"n": 7}, {"n": 100}), default_shape={"n": 1 << 16},
    cost=lambda s: Cost(bytes_moved=12 * s["n"], flops=5 * s["n"]),
)
"""


def kfactory(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args], capture_output=True, text=True, timeout=380
    )


class BrokenWriter(Actor):
    """A kernel writer that fails on every candidate, with an error no retry can fix."""

    role = "kernel-writer"
    reacts_to = (CandidateProposed,)
    max_deliver = 2
    give_up_after = 0.0

    async def handle(self, event: Event, out: Reactions) -> None:
        raise ValueError("this writer is broken")


class Crew:
    """Actors in this process that a test starts and stops one by one."""

    def __init__(self, url: str, auth: Callable[[str], ClientAuth]) -> None:
        self._url = url
        self._auth = auth
        self._running: dict[str, tuple[asyncio.Event, asyncio.Task[None], Client]] = {}

    async def start(self, name: str, actor: Actor) -> None:
        nc = await connect(self._url, f"kf-{actor.role}", auth=self._auth(actor.role))
        stop = asyncio.Event()
        task = asyncio.create_task(ActorRuntime(actor, nc, name).run(stop), name=name)
        self._running[name] = (stop, task, nc)

    async def stop(self, name: str) -> None:
        stop, task, nc = self._running.pop(name)
        stop.set()
        await task
        await nc.close()

    async def stop_all(self) -> None:
        for name in list(self._running):
            await self.stop(name)


@asynccontextmanager
async def crew(hub: Hub, broken: dict[str, Actor] | None = None) -> AsyncIterator[Crew]:
    """Every cpu role (or the broken stand-in given for it), each under its role's name."""
    team = Crew(hub.url, hub.auth)
    try:
        for name, role in ROLES.items():
            if role.targets is not None and "cpu" not in role.targets:
                continue
            await team.start(name, (broken or {}).get(name) or role.create("cpu"))
        yield team
    finally:
        await team.stop_all()


def small_campaign(name: str, budget: int, per_generation: int) -> CampaignSpec:
    return CampaignSpec(
        problem="softmax",
        name=name,
        shapes=[[64, 256]],
        budget=Budget(candidates=budget, wall_time="10m", stop_at_roofline=1.5),
        search=Search(per_generation=per_generation, seed=7),
    )


async def run_campaign(hub: Hub, spec: CampaignSpec, timeout: float) -> dict[str, Any]:
    result = await asyncio.wait_for(
        follow_campaign(spec, hub.url, hub.auth("cli"), None, asyncio.Event(), Console(quiet=True)),
        timeout,
    )
    assert result is not None
    return result


def settled_once(events: list[Event]) -> Counter[str]:
    """How many outcomes each proposed candidate got (a dead letter counts as one)."""
    proposed = {e.candidate_id for e in events if isinstance(e, CandidateProposed)}
    by_candidate: dict[str, str] = {}
    for e in events:
        if e.type == "DeadLettered":
            original = next(
                (x for x in events if x.event_id == getattr(e, "original_event_id", None)), None
            )
            by_candidate.setdefault(e.event_id, getattr(original, "candidate_id", "?"))
        elif e.type in SETTLING:
            by_candidate[e.event_id] = getattr(e, "candidate_id", "?")
    counts = Counter(by_candidate.values())
    return Counter({c: counts.get(c, 0) for c in proposed})


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_every_candidate_dead_lettered_settles_them_failed_and_stalls_the_campaign(
    hub: Hub,
) -> None:
    spec = small_campaign("dead", budget=6, per_generation=3)
    async with crew(hub, {"kernel-writer": BrokenWriter()}):
        began = time.monotonic()
        result = await run_campaign(hub, spec, timeout=90)
        took = time.monotonic() - began
    assert result["stalled"]["kind"] == "dead_lettered", result
    assert "this writer is broken" in result["stalled"]["detail"]
    assert result["rejected_by_stage"] == {"dead_letter": 3}
    assert took < 30, f"the stall took {took:.1f} s to be said"
    events = [e for _, e in await replay(hub.nc, campaign_id="dead")]
    assert set(settled_once(events).values()) == {1}
    types = [e.type for e in events]
    assert types.count("GenerationClosed") == 1 and types.count("GenerationOpened") == 1
    assert "CampaignFinished" not in types


def test_a_problem_with_no_design_space_stops_the_run_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "my_ops.py").write_text(USER_PROBLEM)
    campaign = tmp_path / "c.toml"
    campaign.write_text(f'problem = "{tmp_path}/my_ops.py:SWIGLU"\n[budget]\ncandidates = 4\n')
    began = time.monotonic()
    home = str(tmp_path / "h")
    done = kfactory(
        "run", str(campaign), "--home", home, "--budget", "3", "--name", "swig", "--json"
    )
    took = time.monotonic() - began
    assert done.returncode == 3, done.stderr
    assert "campaign stalled (no_design_space): no design space to search for" in done.stderr
    result = json.loads(done.stdout)
    assert result["campaign_id"] == "swig" and result["stalled"]["kind"] == "no_design_space"
    assert took < 60, f"the run took {took:.1f} s to say it stalled"
    started = kfactory(
        "sql",
        "-f",
        "json",
        "--home",
        home,
        "SELECT payload->'config'->'budget'->>'candidates' AS n FROM events "
        "WHERE type = 'CampaignStarted'",
    )
    assert json.loads(started.stdout) == [{"n": "3"}], "--budget did not override the file"


async def outage_of(hub: Hub, role: str, seconds: float) -> None:
    spec = small_campaign(f"outage-{role}", budget=4, per_generation=2)
    async with crew(hub) as team:
        running = asyncio.create_task(run_campaign(hub, spec, timeout=600))
        await asyncio.sleep(2)
        await team.stop(role)
        await asyncio.sleep(seconds)
        await team.start(role, ROLES[role].create("cpu"))
        result = await running
    assert result["finished"].startswith("budget reached"), result
    events = [e for _, e in await replay(hub.nc, campaign_id=spec.campaign_id)]
    assert "DeadLettered" not in [e.type for e in events]
    counts = settled_once(events)
    assert len(counts) == 4 and set(counts.values()) == {1}, counts


@pytest.mark.slow  # a whole campaign with a 20 s outage: a minute or two
@pytest.mark.asyncio
@pytest.mark.timeout(700)
@pytest.mark.parametrize(
    "role", ["librarian", "planner", "kernel-writer", "verifier", "benchmarker", "fuser"]
)
async def test_a_20s_outage_of_a_role_loses_nothing_and_the_campaign_finishes(
    hub: Hub, role: str
) -> None:
    await outage_of(hub, role, 20)


@pytest.mark.slow  # 20 s of campaign and one benchmark
@pytest.mark.timeout(400)
def test_wall_time_ends_the_run_within_one_benchmark_of_the_deadline(tmp_path: Path) -> None:
    home = str(tmp_path / "h")
    began = time.monotonic()
    done = kfactory(
        "run",
        "--problem",
        "softmax",
        "--shapes",
        "256x1024",
        "--budget",
        "40",
        "--per-generation",
        "2",
        "--wall-time",
        "20s",
        "--name",
        "wall",
        "--home",
        home,
        "--json",
    )
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["finished"] == "budget reached: wall time"
    assert result["evaluated"] < 40
    (span,) = json.loads(
        kfactory(
            "sql",
            "-f",
            "json",
            "--home",
            home,
            "SELECT epoch(max(ts) FILTER (type = 'CampaignFinished')) - "
            "epoch(min(ts) FILTER (type = 'CampaignStarted')) AS s FROM events",
        ).stdout
    )
    # The deadline is checked every second; proposing stops there.
    assert 20 <= span["s"] < 20 + 5, span
    # The run then lets the benchmark in flight finish (or cancels it): generous bounds
    # for the hub's start and stop and one benchmark on a busy host.
    assert took < 20 + 300, f"the run took {took:.0f} s"
