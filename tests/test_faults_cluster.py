"""Faults of a 3-node JetStream cluster (bus/cluster.py). Real nats-servers, recorder,
DuckDB and actors, running the tiny vector-add problem (tests/vadd_problem.py). Both slow.

- the KF_EVENTS leader SIGKILLed mid-campaign: the campaign finishes, every event id seen
  published is in the store, and each candidate settles once;
- the recording hub (a `kfactory server` process) SIGKILLed mid-campaign: the standby
  takes the lease, and its store holds every published event once, its chain intact.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from rich.console import Console

from actors.campaign.campaign_file import load_campaign
from actors.roles.registry import ROLES
from bus.auth import ClientAuth
from bus.cluster import LocalCluster, wait_for_jetstream
from bus.connection import Msg, connect, jetstream
from bus.subjects import STREAM
from eventstore.codec import decode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.queries import replay
from ops.hub import Hub, running_hub
from ops.run_cmd import follow_campaign
from tests.fault_swarm import CPU_ROLES, crew_without
from tests.test_stalls import Crew, run_campaign, settled_once
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
        self.types: list[str] = []

    async def on_event(self, msg: Msg) -> None:
        event = decode(msg.data)
        self.ids.add(event.event_id)
        self.types.append(event.type)


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


def recording_server(home: Path, url: str, ttl: int) -> subprocess.Popen[bytes]:
    """`kfactory server --nats` recording into `home`; it prints its URL once it owns the
    recording lease (a standby prints nothing until it takes over)."""
    with home.with_suffix(".log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "server", "--home", str(home), "--nats", url,
             "--lease-ttl", str(ttl)],
            stdout=subprocess.PIPE,
            stderr=log,
        )  # fmt: skip


async def owns(server: subprocess.Popen[bytes], timeout: float) -> None:
    assert server.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(server.stdout.readline), timeout)
    assert line.decode().startswith("nats://"), line


# tests/test_recorder_standby.py takes over from a killed owner while a test publishes
# events; here the owner is killed in the middle of a campaign of real actors.
@pytest.mark.slow  # a campaign and a lease expiry across two server processes: about a minute
@pytest.mark.asyncio
@pytest.mark.timeout(400)
async def test_the_recording_hub_killed_mid_campaign_the_standby_records_every_event_once(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    await wait_for_jetstream(cluster.urls)
    spec = load_campaign(vadd_campaign(tmp_path / "problem", "hub-kill", budget=4))
    owner = recording_server(tmp_path / "owner", cluster.url, ttl=2)
    standby: subprocess.Popen[bytes] | None = None
    published = Published()
    watcher = await connect(cluster.url, "kf-test-watch")
    await watcher.subscribe("kf.ev.>", cb=published.on_event)
    team = Crew(cluster.url, lambda user: ClientAuth(None))
    try:
        await owns(owner, 60)
        standby = recording_server(tmp_path / "standby", cluster.url, ttl=2)
        for name in CPU_ROLES:
            await team.start(name, ROLES[name].create("cpu"))
        running = asyncio.create_task(
            asyncio.wait_for(
                follow_campaign(spec, cluster.url, ClientAuth(None), None, asyncio.Event(),
                                Console(quiet=True)),
                300,
            )
        )  # fmt: skip
        while not any(t == "KernelVerified" for t in published.types):
            await asyncio.sleep(0.1)
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
        await owns(standby, 60)
        result = await running
        assert result is not None and result["finished"].startswith("budget reached"), result
        await asyncio.sleep(2)  # the last events reach the recorder
    finally:
        await team.stop_all()
        await watcher.close()
        for server in (owner, standby):
            if server is not None and server.poll() is None:
                server.send_signal(signal.SIGTERM)
                server.wait(60)
    store = DuckDBEventStore(tmp_path / "standby" / "events.duckdb", read_only=True)
    try:
        assert store.verify_chain().ok
        rows = store.query("SELECT event_id FROM events").rows
    finally:
        store.close()
    stored = [row[0] for row in rows]
    assert len(stored) == len(set(stored)), "an event stored twice"
    assert published.ids <= set(stored), published.ids - set(stored)
