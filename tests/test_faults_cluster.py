"""Faults of a 3-node JetStream cluster (bus/cluster.py): a node killed mid-campaign.
Real nats-servers, recorder, DuckDB and actors, running the tiny vector-add problem."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from actors.campaign import load_campaign
from bus.cluster import LocalCluster, wait_for_jetstream
from bus.connection import Msg, connect, jetstream
from bus.subjects import STREAM
from eventstore.codec import decode
from eventstore.queries import replay
from ops.hub import Hub, running_hub
from tests.fault_swarm import crew_without
from tests.test_stalls import run_campaign, settled_once
from tests.vadd_problem import vadd_campaign


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", size=3) as nodes:
        yield nodes


@pytest_asyncio.fixture
async def cluster_hub(tmp_path: Path, cluster: LocalCluster) -> AsyncIterator[Hub]:
    await wait_for_jetstream(cluster.urls)
    async with running_hub(tmp_path / "home", nats_url=cluster.url) as hub:
        yield hub


class Published:
    """The id of every event seen published on the bus (core NATS, from any node)."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    async def on_event(self, msg: Msg) -> None:
        self.ids.add(decode(msg.data).event_id)


async def recorded(hub: Hub, event_type: str, timeout: float) -> None:
    """Return once the store holds an event of `event_type`."""
    for _ in range(int(timeout / 0.2)):
        count = hub.store.query(f"SELECT count(*) FROM events WHERE type = '{event_type}'")
        if count.rows[0][0]:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"no {event_type} recorded in {timeout:.0f} s")


async def stored_ids(hub: Hub, wanted: set[str], timeout: float = 30.0) -> set[str]:
    """The store's event ids, once it holds all of `wanted` (or after `timeout`)."""
    for _ in range(int(timeout / 0.2)):
        stored = {row[0] for row in hub.store.query("SELECT event_id FROM events").rows}
        if wanted <= stored:
            break
        await asyncio.sleep(0.2)
    return stored


async def stream_leader(hub: Hub) -> int:
    """The index of the node leading KF_EVENTS."""
    info = await jetstream(hub.nc).stream_info(STREAM)
    assert info.cluster is not None and info.config.num_replicas == 3, info
    return int(str(info.cluster.leader).removeprefix("n")) - 1


@pytest.mark.slow  # a campaign of four across a leader election: about a minute
@pytest.mark.asyncio
@pytest.mark.timeout(400)
async def test_the_stream_leader_killed_mid_campaign_loses_no_event(
    cluster: LocalCluster, cluster_hub: Hub, tmp_path: Path
) -> None:
    hub = cluster_hub
    spec = load_campaign(vadd_campaign(tmp_path / "problem", "node-kill", budget=4))
    published = Published()
    watcher = await connect(cluster.url, "kf-test-watch")
    await watcher.subscribe("kf.ev.>", cb=published.on_event)
    try:
        async with crew_without(hub):
            running = asyncio.create_task(run_campaign(hub, spec, timeout=300))
            await recorded(hub, "KernelVerified", timeout=120)  # mid-campaign
            victim = await stream_leader(hub)
            await asyncio.to_thread(cluster.kill, victim)
            result = await running
        assert result["finished"].startswith("budget reached"), result
        stored = await stored_ids(hub, published.ids)
        assert published.ids, "the watch saw nothing"
        assert published.ids <= stored, published.ids - stored
        events = [e for _, e in await replay(hub.nc, campaign_id=spec.campaign_id)]
        counts = settled_once(events)
        assert len(counts) == 4 and set(counts.values()) == {1}, counts
        assert await stream_leader(hub) != victim
    finally:
        await watcher.close()
