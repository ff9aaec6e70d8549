"""The planner against a real nats-server, recorder and DuckDB store: a generation of
many points takes seconds of search, and the event loop it shares with the other actors
(and, in `kfactory run`, with the recorder's lease) keeps running meanwhile."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from actors.campaign.campaign_file import load_campaign
from actors.roles.librarian import Librarian
from actors.roles.planner import Planner
from actors.runtime import ActorRuntime
from bus.connection import connect, jetstream
from eventstore.emitter import Emitter
from eventstore.events import ActorRef, CampaignStarted, new_event
from ops.hub import Hub

PROPOSED = 24
CAMPAIGN = f"""
name = "wide"
problem = "softmax"
target = "cpu"
shapes = [[4096, 4096]]
[budget]
candidates = {PROPOSED}
wall_time = "10m"
[search]
per_generation = {PROPOSED}
seed = 1
"""


@pytest.mark.asyncio
async def test_a_wide_generation_is_searched_off_the_event_loop(hub: Hub, tmp_path: Path) -> None:
    path = tmp_path / "wide.toml"
    path.write_text(CAMPAIGN)
    spec = load_campaign(path)
    nc = await connect(hub.url, "kf-planner")
    stop = asyncio.Event()
    runtimes = [
        ActorRuntime(Planner(), nc, "planner-t").run(stop),
        ActorRuntime(Librarian(), nc, "librarian-t").run(stop),
    ]
    running = [asyncio.create_task(r) for r in runtimes]
    proposed = "SELECT count(*) FROM events WHERE type = 'CandidateProposed'"
    longest = 0.0
    try:
        await Emitter(jetstream(hub.nc)).emit(
            new_event(
                CampaignStarted,
                campaign_id=spec.campaign_id,
                actor=ActorRef(role="cli", instance="cli-t", host="test"),
                name=spec.campaign_id,
                problem=spec.problem,
                target=spec.target,
                config=spec.to_config(),
            )
        )
        deadline = time.monotonic() + 300
        last = time.monotonic()
        while hub.store.query(proposed).rows[0][0] < PROPOSED:
            assert time.monotonic() < deadline, "the generation was never proposed"
            await asyncio.sleep(0.05)
            now = time.monotonic()
            longest, last = max(longest, now - last), now
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*running), 60)
        await nc.close()
    # the search itself takes several seconds here; the loop never stops for as long as
    # the recorder's lease lives (5 s) or anywhere near it
    assert longest < 2.0, f"the event loop stood still for {longest:.1f} s"
