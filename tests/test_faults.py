"""Faults survived on one machine: workers killed mid-job, a poison event, wrong
credentials. Real nats-server, recorder, DuckDB and `kfactory actor` processes, running
the tiniest real problem (tests/vadd_problem.py) so campaigns take seconds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from actors.campaign import load_campaign
from actors.roles import ROLES
from eventstore.queries import replay
from ops.hub import Hub, running_hub
from tests.fault_swarm import ActorProcess, crew_without, outcomes, watching_beats
from tests.test_stalls import run_campaign, settled_once
from tests.vadd_problem import vadd_campaign

#: The event a role emits for each candidate it finishes with (or rejects).
OUTCOMES = {"verifier": ("KernelVerified", "KernelRejected"),
            "benchmarker": ("BenchmarkCompleted", "KernelRejected")}  # fmt: skip


@pytest_asyncio.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Hub]:
    """The embedded default: a nats-server with credentials on, the recorder beside it."""
    async with running_hub(tmp_path / "home") as hub:
        yield hub


async def kill_mid_job(hub: Hub, tmp_path: Path, role: str) -> None:
    spec = load_campaign(vadd_campaign(tmp_path / "problem", f"kill-{role}", budget=4))
    victim = ActorProcess.of_hub(hub, role, f"{role}-victim", tmp_path / "logs")
    try:
        async with watching_beats(hub) as beats, crew_without(hub, role) as team:
            running = asyncio.create_task(run_campaign(hub, spec, timeout=300))
            busy = await beats.until(
                lambda b: b.instance == victim.instance and b.state == "working", 120, victim
            )
            victim.kill()
            # what a supervisor does: another instance of the role comes up
            await team.start(f"{role}-stand-in", ROLES[role].create("cpu"))
            result = await running
    finally:
        victim.stop()
    assert result["finished"].startswith("budget reached"), result
    events = [e for _, e in await replay(hub.nc, campaign_id=spec.campaign_id)]
    counts = settled_once(events)
    assert len(counts) == 4 and set(counts.values()) == {1}, counts
    assert "DeadLettered" not in [e.type for e in events]
    candidate = busy.job.split()[-1]
    done = [e for e in outcomes(events, role)[candidate] if e.type in OUTCOMES[role]]
    # the killed job was redelivered and done once, by the instance that took over
    assert [e.actor.instance for e in done] == [f"{role}-stand-in"], done


@pytest.mark.asyncio
@pytest.mark.timeout(400)
async def test_a_benchmarker_killed_mid_job_has_the_job_redelivered_and_done_once(
    secured: Hub, tmp_path: Path
) -> None:
    await kill_mid_job(secured, tmp_path, "benchmarker")


@pytest.mark.slow  # a verification takes about a second: the kill may land between jobs
@pytest.mark.asyncio
@pytest.mark.timeout(400)
async def test_a_verifier_killed_mid_job_has_the_job_redelivered_and_done_once(
    secured: Hub, tmp_path: Path
) -> None:
    await kill_mid_job(secured, tmp_path, "verifier")
