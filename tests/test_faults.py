"""Faults survived on one machine. Real nats-server, recorder, DuckDB and `kfactory actor`
processes (helpers in tests/fault_swarm.py), running the tiniest real problem
(tests/vadd_problem.py, a user problem with its own template) so campaigns take seconds.

- a benchmarker or verifier SIGKILLed mid-job (slow): the job is redelivered after the
  ack wait and done once, by the instance that took over; the campaign finishes;
- one event whose handler always raises: dead-lettered after `max_deliver`; the other
  candidates settle and the campaign finishes;
- an actor with an unknown seed: the process stops with one line naming the refused
  credentials, and the server logs the authentication error;
- a worker host partitioned mid-job, then healed (slow; needs root and iproute2): another
  host does the job; the far host's late result, with the same cause-derived id, is
  stored once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from actors.campaign.campaign_file import load_campaign
from actors.roles.kernel_writer import KernelWriter
from actors.roles.registry import ROLES
from actors.runtime import Reactions
from bus.auth import create_seed_file
from bus.connection import Msg, connect
from eventstore.codec import decode
from eventstore.events import BenchmarkCompleted, DeadLettered, Event
from eventstore.queries import replay
from ops.accounts import seed_path
from ops.hub import Hub, running_hub
from tests.fault_swarm import (
    ActorProcess,
    WorkerHost,
    crew_without,
    outcomes,
    watching_beats,
)
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


@pytest.fixture
def secured_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`kfactory server` with credentials on: its URL and the nats-server's log."""
    home = tmp_path / "hub"
    server = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "server", "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().decode().strip()
        assert url.startswith("nats://"), url
        yield url, home / "nats" / "nats-server.log"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


async def kill_mid_job(hub: Hub, tmp_path: Path, role: str) -> None:
    spec = load_campaign(vadd_campaign(tmp_path / "problem", f"kill-{role}", budget=2))
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
    assert len(counts) == 2 and set(counts.values()) == {1}, counts
    assert "DeadLettered" not in [e.type for e in events]
    candidate = busy.job.split()[-1]
    done = [e for e in outcomes(events, role)[candidate] if e.type in OUTCOMES[role]]
    # the killed job was redelivered and done once, by the instance that took over
    assert [e.actor.instance for e in done] == [f"{role}-stand-in"], done


@pytest.mark.slow  # about 40 s: the redelivery waits out the ack wait (10 s)
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


class PoisonedWriter(KernelWriter):
    """A kernel writer whose handler raises, every time, on one candidate's event."""

    max_deliver = 3
    give_up_after = 0.0

    def __init__(self, poisoned: str) -> None:
        super().__init__()
        self.poisoned = poisoned
        self.attempts = 0

    async def handle(self, event: Event, out: Reactions) -> None:
        if getattr(event, "candidate_id", None) == self.poisoned:
            self.attempts += 1
            raise RuntimeError(f"poisoned: {self.poisoned}")
        await super().handle(event, out)


# tests/test_retries.py gives up on a permanent error after max_deliver (one consumer);
# tests/test_stalls.py stalls a campaign whose every candidate is dead-lettered. Here one
# poison event among good ones: dead-lettered, and the campaign goes on to its end.
@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_a_poison_event_is_dead_lettered_after_max_deliver_and_the_campaign_goes_on(
    hub: Hub, tmp_path: Path
) -> None:
    spec = load_campaign(vadd_campaign(tmp_path / "problem", "poison", budget=2))
    poisoned = f"{spec.campaign_id}:g0:c1"
    writer = PoisonedWriter(poisoned)
    async with crew_without(hub, "kernel-writer") as team:
        await team.start("kernel-writer", writer)
        result = await run_campaign(hub, spec, timeout=240)
    assert result["finished"].startswith("budget reached"), result
    assert result["rejected_by_stage"] == {"dead_letter": 1}, result
    events = [e for _, e in await replay(hub.nc, campaign_id=spec.campaign_id)]
    (dead,) = [e for e in events if isinstance(e, DeadLettered)]
    original = next(e for e in events if e.event_id == dead.original_event_id)
    assert getattr(original, "candidate_id", None) == poisoned
    assert dead.deliveries == writer.attempts == PoisonedWriter.max_deliver
    assert f"RuntimeError: poisoned: {poisoned}" in dead.reason
    counts = settled_once(events)
    assert len(counts) == 2 and set(counts.values()) == {1}, counts
    assert sum(isinstance(e, BenchmarkCompleted) for e in events) == 1
    assert "CampaignFinished" in [e.type for e in events]


# tests/test_bus_auth.py refuses a client with an unknown seed, in process. Here the
# actor process itself: it stops with a one-line reason in its log, and the server logs it.
@pytest.mark.timeout(120)
def test_an_actor_with_the_wrong_credentials_is_refused_and_the_refusal_is_logged(
    secured_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, server_log = secured_server
    stranger = tmp_path / "stranger.nk"
    create_seed_file(stranger)
    actor = ActorProcess("verifier", url, stranger, "verifier-stranger", tmp_path / "a.log")
    assert actor.process.wait(60) != 0
    said = actor.log.read_text().strip().splitlines()
    assert said == [
        f"kfactory: AuthError: {url} refused the connection: "
        f"the credentials in {stranger} are not accepted"
    ]
    assert "authentication error" in server_log.read_text()


@pytest.fixture
def worker_host() -> Iterator[WorkerHost]:
    why = WorkerHost.unavailable()
    if why is not None:
        pytest.skip(f"no second host to partition: {why}")
    host = WorkerHost(os.getpid() % 10000)
    host.destroy()  # a leftover of a killed run
    host.create()
    try:
        yield host
    finally:
        host.destroy()


@pytest.mark.slow  # a redelivery (10 s ack wait) and TCP's retransmission after the heal
@pytest.mark.asyncio
@pytest.mark.timeout(400)
async def test_a_partitioned_host_has_its_job_done_elsewhere_and_its_late_result_deduplicated(
    tmp_path: Path, worker_host: WorkerHost
) -> None:
    spec = load_campaign(vadd_campaign(tmp_path / "problem", "partition", budget=2))
    async with running_hub(tmp_path / "home", listen=worker_host.hub_address) as hub:
        far = ActorProcess(
            "verifier",
            hub.url,
            seed_path(hub.home, "verifier"),
            "verifier-far",
            tmp_path / "logs" / "verifier-far.log",
            prefix=worker_host.prefix,
        )
        published: Counter[tuple[str, str]] = Counter()  # (event id, instance): times seen

        async def on_event(msg: Msg) -> None:
            event = decode(msg.data)
            published[event.event_id, event.actor.instance] += 1

        watcher = await connect(hub.url, "kf-test-watch", auth=hub.auth("admin"))
        await watcher.subscribe("kf.ev.>", cb=on_event)
        try:
            async with watching_beats(hub) as beats, crew_without(hub, "verifier") as team:
                running = asyncio.create_task(run_campaign(hub, spec, timeout=300))
                # past its device share (a KV lease): the rest of the job needs no bus
                busy = await beats.until(
                    lambda b: b.instance == far.instance and b.state == "verifying", 120, far
                )
                worker_host.partition()
                await team.start("verifier-near", ROLES["verifier"].create("cpu"))
                result = await running
                candidate = busy.job.split()[-1]
                events = [e for _, e in await replay(hub.nc, campaign_id=spec.campaign_id)]
                (outcome,) = [e for e in outcomes(events, "verifier")[candidate]]
                assert outcome.actor.instance == "verifier-near"  # picked up elsewhere
                worker_host.heal()
                for _ in range(600):  # TCP retransmits what the far host sent, late
                    if published[outcome.event_id, far.instance]:
                        break
                    await asyncio.sleep(0.1)
                far.check()
        finally:
            await watcher.close()
            far.stop()
        assert result["finished"].startswith("budget reached"), result
        # the far host published the same result (the same derived id) once healed, maybe
        # more than once (its publisher retries); the stream and the store kept the first
        assert published[outcome.event_id, far.instance] >= 1, "no late result arrived"
        assert published[outcome.event_id, "verifier-near"] == 1
        events = [e for _, e in await replay(hub.nc, campaign_id=spec.campaign_id)]
        assert [e.event_id for e in events].count(outcome.event_id) == 1
        counts = settled_once(events)
        assert len(counts) == 2 and set(counts.values()) == {1}, counts
