"""The actor runtime against a real nats-server, recorder and DuckDB file."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest

from actors.runtime import ActorRuntime
from bus.connection import connect, jetstream
from bus.server import EmbeddedNatsServer
from eventstore.emitter import Emitter
from ops.hub import Hub
from tests.conftest import started
from tests.echo_actor import EchoActor


@contextlib.asynccontextmanager
async def running(actor: EchoActor, url: str) -> AsyncIterator[ActorRuntime]:
    nc = await connect(url, "echo")
    runtime = ActorRuntime(actor, nc)
    stop = asyncio.Event()
    task = asyncio.create_task(runtime.run(stop))
    try:
        yield runtime
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await nc.close()


async def wait_rows(hub: Hub, sql: str, count: int, timeout: float = 30) -> list[list[object]]:
    deadline = time.monotonic() + timeout
    while True:
        found = hub.store.query(sql).rows
        if len(found) >= count or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.1)


@pytest.mark.asyncio
async def test_reactions_carry_causation_and_correlation(hub: Hub) -> None:
    causes = [started(name=f"n{i}") for i in range(3)]
    async with running(EchoActor(), hub.url):
        await Emitter(jetstream(hub.nc)).emit_many(causes)
        found = await wait_rows(
            hub,
            "SELECT causation_id, correlation_id, payload->>'reason', actor_role FROM events "
            "WHERE type = 'CampaignFinished' ORDER BY position",
            3,
        )
    assert sorted(found) == sorted(
        [[c.event_id, c.event_id, f"echo of {c.name}", "planner"] for c in causes]
    )
    lifecycle = hub.store.query(
        "SELECT type, campaign_id FROM events WHERE actor_role = 'planner' "
        "AND type IN ('ActorStarted', 'ActorStopped') ORDER BY position"
    ).rows
    assert lifecycle[0] == ["ActorStarted", "kf-system"]


@pytest.mark.asyncio
async def test_a_handler_retried_after_emitting_stores_its_reaction_once(hub: Hub) -> None:
    cause = started()
    actor = EchoActor(fail_first=1)  # emits, then fails before the ack: redelivered
    async with running(actor, hub.url):
        await Emitter(jetstream(hub.nc)).emit(cause)
        deadline = time.monotonic() + 30
        while actor.calls < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
    found = await wait_rows(hub, "SELECT event_id FROM events WHERE type = 'CampaignFinished'", 1)
    assert actor.calls == 2
    assert len(found) == 1


@pytest.mark.asyncio
async def test_failures_become_dead_letters_and_junk_only_a_rejection(hub: Hub) -> None:
    doomed = started(name="always-fails")
    async with running(EchoActor(), hub.url):
        await Emitter(jetstream(hub.nc)).emit(doomed)
        await hub.nc.publish("kf.ev.c1.CampaignStarted", b"{not an event")
        found = await wait_rows(
            hub,
            "SELECT payload->>'consumer', payload->>'reason', payload->>'original_event_id', "
            "actor_role FROM events WHERE type = 'DeadLettered' ORDER BY position",
            1,
            timeout=60,
        )
        await asyncio.sleep(0.5)
    # junk is the recorder's to refuse (an EventRejected); the actor drops it unseen
    assert len(found) == 1, found
    failed = found[0]
    assert failed[0] == "kf-planner" and failed[2] == doomed.event_id
    assert "RuntimeError" in str(failed[1]) and "gave up after 3 deliveries" in str(failed[1])
    rejected = hub.store.query("SELECT count(*) FROM events WHERE type = 'EventRejected'").rows
    assert rejected == [[1]]


def _actor_process(url: str, slow: float, grace: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.echo_actor", url, str(slow), str(grace)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _wait_started(hub: Hub, instances: int) -> None:
    await wait_rows(
        hub,
        "SELECT 1 FROM events WHERE type = 'ActorStarted' AND actor_role = 'planner'",
        instances,
    )


@pytest.mark.asyncio
async def test_sigterm_finishes_in_flight_work_within_the_grace(hub: Hub) -> None:
    actor = _actor_process(hub.url, slow=2.0, grace=10.0)
    await _wait_started(hub, 1)
    await Emitter(jetstream(hub.nc)).emit(started())
    await asyncio.sleep(0.8)  # mid-handler
    actor.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(actor.wait, 30) == 0
    found = await wait_rows(hub, "SELECT 1 FROM events WHERE type = 'CampaignFinished'", 1)
    assert len(found) == 1
    stopped = await wait_rows(hub, "SELECT 1 FROM events WHERE type = 'ActorStopped'", 1)
    assert len(stopped) == 1


@pytest.mark.asyncio
async def test_sigterm_past_the_grace_leaves_work_for_another_instance(hub: Hub) -> None:
    first = _actor_process(hub.url, slow=30.0, grace=0.5)
    await _wait_started(hub, 1)
    cause = started()
    await Emitter(jetstream(hub.nc)).emit(cause)
    await asyncio.sleep(1.0)
    first.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(first.wait, 30) == 0
    assert hub.store.query("SELECT 1 FROM events WHERE type = 'CampaignFinished'").rows == []
    async with running(EchoActor(), hub.url):
        found = await wait_rows(
            hub, "SELECT causation_id FROM events WHERE type = 'CampaignFinished'", 1
        )
    assert found == [[cause.event_id]]


@pytest.mark.asyncio
async def test_a_server_restart_loses_nothing_and_clients_reconnect(
    hub: Hub, nats_server: EmbeddedNatsServer
) -> None:
    total = 150
    causes = [started(name=f"n{i}") for i in range(total)]
    publisher = await connect(nats_server.url, "publisher")
    emitter = Emitter(jetstream(publisher))

    async def publish_steadily() -> None:
        for cause in causes:
            await emitter.emit(cause)
            await asyncio.sleep(0.01)

    async with running(EchoActor(), hub.url):
        publishing = asyncio.create_task(publish_steadily())
        await asyncio.sleep(0.5)
        await asyncio.to_thread(nats_server.restart, 2.0)
        await asyncio.wait_for(publishing, 120)
        found = await wait_rows(
            hub,
            "SELECT DISTINCT causation_id FROM events WHERE type = 'CampaignFinished'",
            total,
            timeout=90,
        )
    await publisher.close()
    stored = hub.store.query(
        "SELECT count(*), count(DISTINCT event_id) FROM events WHERE type = 'CampaignStarted'"
    ).rows
    assert stored == [[total, total]]
    assert {row[0] for row in found} == {c.event_id for c in causes}
    finished = hub.store.query("SELECT count(*) FROM events WHERE type = 'CampaignFinished'").rows
    assert finished == [[total]]
    assert hub.store.verify_chain().ok
