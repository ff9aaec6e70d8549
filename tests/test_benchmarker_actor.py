"""The benchmarker actor against a real nats-server, recorder, librarian and compiler."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import msgspec
import pytest

from actors.roles.benchmarker import Benchmarker
from actors.runtime import Actor, ActorRuntime
from bus.connection import connect, jetstream
from eventstore.emitter import Emitter
from eventstore.events import (
    ActorRef,
    CampaignStarted,
    CandidateProposed,
    GenerationOpened,
    KernelVerified,
    KernelWritten,
    new_event,
)
from eventstore.ids import new_event_id
from kernels.identity import source_hash
from ops.hub import Hub
from tests.recorded_campaign import TWO_GENERATIONS, load_log

VERIFIER = ActorRef(role="verifier", instance="verifier-t", host="test")


@contextlib.asynccontextmanager
async def running(hub: Hub, *actors: Actor) -> AsyncIterator[list[ActorRuntime]]:
    stop = asyncio.Event()
    runtimes, tasks, clients = [], [], []
    for actor in actors:
        nc = await connect(hub.url, f"kf-{actor.role}")
        clients.append(nc)
        runtimes.append(ActorRuntime(actor, nc))
        tasks.append(asyncio.create_task(runtimes[-1].run(stop)))
    try:
        yield runtimes
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        for nc in clients:
            await nc.close()


async def rows(hub: Hub, sql: str, timeout: float = 120) -> list[list[object]]:
    deadline = time.monotonic() + timeout
    while True:
        found = hub.store.query(sql).rows
        if found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.1)


@pytest.mark.asyncio
async def test_a_kernel_that_does_not_build_is_rejected_once_with_the_compiler_s_message(
    hub: Hub,
) -> None:
    """A verified kernel that fails to build where it is timed (another host's compiler,
    a changed toolchain) is KernelRejected at the compile stage on its first delivery:
    no retries, no dead letter."""
    log = load_log(TWO_GENERATIONS)
    started = next(e for e in log if isinstance(e, CampaignStarted))
    opened = next(e for e in log if isinstance(e, GenerationOpened))
    proposal = next(e for e in log if isinstance(e, CandidateProposed))
    good = next(e for e in log if isinstance(e, KernelWritten))
    broken = good.source.replace("{", "{ int broken = no_such_variable;", 1)
    written = msgspec.structs.replace(
        good, event_id=new_event_id(), source=broken, source_hash=source_hash(broken, good.flags)
    )
    verified = new_event(
        KernelVerified,
        campaign_id=good.campaign_id,
        actor=VERIFIER,
        cause=written,
        source_hash=written.source_hash,
        max_rel_err=0.0,
        trials=1,
        **written.work(),
    )
    async with running(hub, Benchmarker()) as (benchmarker,):
        await Emitter(jetstream(hub.nc)).emit_many([started, opened, proposal, written, verified])
        found = await rows(
            hub,
            "SELECT payload->>'stage', payload->>'reason', payload->'evidence'->>'message', "
            "payload->'evidence'->>'log', actor_role, causation_id FROM events "
            "WHERE type = 'KernelRejected'",
        )
    assert len(found) == 1, found
    stage, reason, message, compiler_log, role, cause = found[0]
    assert (stage, reason, role, cause) == (
        "compile",
        "compile_error",
        "benchmarker",
        verified.event_id,
    )
    assert "no_such_variable" in str(message) and "error" in str(message)
    assert "no_such_variable" in str(compiler_log)
    assert benchmarker.handled == 1
    assert hub.store.query("SELECT 1 FROM events WHERE type = 'DeadLettered'").rows == []
