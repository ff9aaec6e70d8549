"""One recorder at a time, against real nats-server processes and real DuckDB files: a
standby `kfactory server` takes over when the owner dies, a deposed one writes nothing
more, and the store refuses a writer whose fencing token is older than the last one."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import structlog

from bus.auth import ClientAuth
from bus.cluster import LocalCluster, wait_for_jetstream
from bus.connection import Client, ConnectStopped, Msg, connect, jetstream
from bus.lease import RECORDER_LEASES, LeaseBucket, LeaseLost
from bus.server import EmbeddedNatsServer
from bus.streams import ensure_events_stream
from eventstore.codec import encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.emitter import Emitter
from eventstore.events import Event
from eventstore.memory_store import MemoryEventStore
from eventstore.queries import StoreStatus, StoreUnavailable, status
from eventstore.store import EventStore, Fence, FencedOut, Recorded
from ops.accounts import seed_path
from ops.hub import RECORDER_KEY, running_hub
from tests.conftest import calibrated, started

#: Short, yet long enough for a renewal to get through on a loaded 2-core machine.
TTL = 3


def _server(home: Path, url: str) -> subprocess.Popen[bytes]:
    """`kfactory server` recording into `home`; its log goes to `home`.log."""
    command = ["server", "--home", str(home), "--nats", url, "--lease-ttl", str(TTL)]
    with _log(home).open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", *command], stdout=subprocess.DEVNULL, stderr=log
        )


def _log(home: Path) -> Path:
    return home.with_suffix(".log")


async def _logged(home: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in _log(home).read_text():
        assert time.monotonic() < deadline, _log(home).read_text()
        await asyncio.sleep(0.1)


async def _status(nc: Client) -> StoreStatus | None:
    try:
        return await status(nc, timeout=1)
    except StoreUnavailable:
        return None


async def _answered_by(nc: Client, store: Path, position: int, timeout: float = 60) -> float:
    """Wait until `store` answers the bus holding `position` events; seconds waited."""
    started_at = time.monotonic()
    while time.monotonic() - started_at < timeout:
        found = await _status(nc)
        if found is not None and found.path == str(store) and found.last_position >= position:
            return time.monotonic() - started_at
        await asyncio.sleep(0.05)
    raise AssertionError(f"{store} did not answer with {position} events; last: {found}")


def _events(count: int, campaign: str) -> list[Event]:
    return [started(campaign) if i % 2 else calibrated(campaign) for i in range(count)]


def _stored(path: Path) -> list[list[object]]:
    store = DuckDBEventStore(path, read_only=True)
    try:
        assert store.verify_chain().ok
        return store.query(
            "SELECT count(*), count(DISTINCT event_id), max(position), count(DISTINCT stream_seq) "
            "FROM events"
        ).rows
    finally:
        store.close()


@pytest.mark.asyncio
async def test_a_standby_takes_over_from_a_killed_owner_of_a_cluster(tmp_path: Path) -> None:
    """The owner is a `kfactory server` process, killed with SIGKILL; the standby a hub in
    this process (two processes: the slow test below)."""
    with LocalCluster(tmp_path / "cluster", size=3) as cluster:
        await wait_for_jetstream(cluster.url)
        nc = await connect(cluster.url, "test")
        owner = _server(tmp_path / "a", cluster.url)
        standby: asyncio.Task[tuple[int, list[list[object]]]] | None = None
        try:
            js = jetstream(nc)
            await ensure_events_stream(js)
            first, second = _events(30, "c1"), _events(20, "c2")
            await Emitter(js).emit_many(first)
            await _answered_by(nc, tmp_path / "a" / "events.duckdb", len(first))
            taken = asyncio.Event()
            standby = asyncio.create_task(_stand_by(tmp_path / "b", cluster.url, taken))
            await asyncio.sleep(TTL)
            assert not taken.is_set()  # the owner renews its lease: the standby waits

            owner.send_signal(signal.SIGKILL)
            owner.wait(10)
            await Emitter(js).emit_many(second)  # while nobody records
            token, stored = await asyncio.wait_for(standby, 30)
        finally:
            if owner.poll() is None:
                owner.kill()
                owner.wait()
            if standby is not None and not standby.done():
                standby.cancel()
            await nc.close()
    # the standby's own store holds every event exactly once, the dead owner's included
    assert stored == [[50, 50, 50, 50]]
    owner_store = DuckDBEventStore(tmp_path / "a" / "events.duckdb", read_only=True)
    try:
        assert owner_store.fence is not None and owner_store.fence.token < token
    finally:
        owner_store.close()


async def _stand_by(home: Path, url: str, taken: asyncio.Event) -> tuple[int, list[list[object]]]:
    async with running_hub(home, nats_url=url, lease_ttl=TTL) as hub:
        taken.set()
        assert hub.lease is not None
        await hub.wait_for_position(50)
        return hub.lease.token, hub.store.query(
            "SELECT count(*), count(DISTINCT event_id), max(position), count(DISTINCT stream_seq) "
            "FROM events"
        ).rows


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_deposed_owner_that_wakes_up_late_writes_nothing_more(
    tmp_path: Path, nats_server: EmbeddedNatsServer
) -> None:
    nc = await connect(nats_server.url, "test")
    owner = standby = None
    try:
        js = jetstream(nc)
        await ensure_events_stream(js)
        before, during = _events(10, "c1"), _events(10, "c2")
        owner = _server(tmp_path / "a", nats_server.url)
        await Emitter(js).emit_many(before)
        await _answered_by(nc, tmp_path / "a" / "events.duckdb", len(before))
        standby = _server(tmp_path / "b", nats_server.url)
        await _logged(tmp_path / "b", "standby")  # it is up, and waits

        owner.send_signal(signal.SIGSTOP)  # a long pause: GC, swap, a frozen VM
        await _answered_by(nc, tmp_path / "b" / "events.duckdb", len(before), 30)
        await Emitter(js).emit_many(during)
        await _answered_by(nc, tmp_path / "b" / "events.duckdb", 20)
        owner.send_signal(signal.SIGCONT)  # it wakes up with `during` in its buffers
        owner_log = _log(tmp_path / "a")
        await _logged(tmp_path / "a", "standing by again")
        assert "lost" in owner_log.read_text()
        assert owner.poll() is None, owner_log.read_text()  # a standby now, not dead
        assert _stored(tmp_path / "a" / "events.duckdb") == [[10, 10, 10, 10]]
        for process in (owner, standby):
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0, owner_log.read_text()
    finally:
        for process in (owner, standby):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()
        await nc.close()
    assert _stored(tmp_path / "b" / "events.duckdb") == [[20, 20, 20, 20]]


@pytest.mark.asyncio
async def test_a_standby_hub_waits_then_takes_over_with_a_newer_token(
    tmp_path: Path, nats_server: EmbeddedNatsServer
) -> None:
    async with running_hub(tmp_path / "a", nats_url=nats_server.url, lease_ttl=TTL) as owner:
        assert owner.lease is not None
        leases = await LeaseBucket.open(jetstream(owner.nc), RECORDER_LEASES, TTL)
        held = await leases.current(RECORDER_KEY)
        assert held is not None and held.token == owner.lease.token
        assert str(tmp_path / "a") in held.holder
        await Emitter(jetstream(owner.nc)).emit_many(_events(5, "c1"))
        await owner.wait_for_position(5)
        standing_by = asyncio.create_task(_standby(tmp_path / "b", nats_server.url))
        await asyncio.sleep(1.5 * TTL)  # renewed all along: the standby stays out
        assert not standing_by.done()
        assert not (tmp_path / "b" / "events.duckdb").exists()
        first_token = owner.lease.token
    # a clean stop releases the lease: no TTL to wait for
    second_token, position, fence = await asyncio.wait_for(standing_by, 30)
    assert second_token > first_token
    assert position == 5 and fence == Fence(second_token, leases.scope)


async def _standby(home: Path, url: str) -> tuple[int, int, Fence | None]:
    async with running_hub(home, nats_url=url, lease_ttl=TTL) as hub:
        assert hub.lease is not None
        await hub.wait_for_position(5)  # it caught up from the stream, under its token
        return hub.lease.token, hub.store.last_position, hub.store.fence


@pytest.mark.asyncio
async def test_a_deposed_hub_stops_recording(
    tmp_path: Path, nats_server: EmbeddedNatsServer
) -> None:
    async with running_hub(tmp_path / "a", nats_url=nats_server.url, lease_ttl=TTL) as hub:
        js = jetstream(hub.nc)
        await Emitter(js).emit_many(_events(5, "c1"))
        await hub.wait_for_position(5)
        # An operator deletes the key; another recorder takes the lease at once.
        await (await js.key_value(RECORDER_LEASES)).delete(RECORDER_KEY)
        leases = await LeaseBucket.open(js, RECORDER_LEASES, TTL)
        assert await leases.try_acquire(RECORDER_KEY, "elsewhere") is not None
        assert hub.lease is not None
        await asyncio.wait_for(hub.lease.lost.wait(), 10)
        await Emitter(js).emit_many(_events(5, "c2"))
        await asyncio.sleep(0.5)
        with pytest.raises(LeaseLost):
            hub.check()
        with pytest.raises(LeaseLost):
            await asyncio.wait_for(hub.recording, 10)  # it ended on the next batch
        assert hub.store.last_position == 5


def _batch(store: EventStore, count: int, cursor: int, fence: Fence) -> int:
    items = [Recorded(e, encode(e), cursor + i + 1) for i, e in enumerate(_events(count, "c"))]
    return store.append(items, cursor + count, fence).appended


@pytest.mark.parametrize("kind", ["duckdb", "memory"])
def test_the_store_refuses_a_writer_with_an_older_token(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "events.duckdb"
    store: EventStore = DuckDBEventStore(path) if kind == "duckdb" else MemoryEventStore()
    scope = "KF_RECORDER_LEASE@2026-12-01T00:00:00"
    try:
        assert _batch(store, 3, 0, Fence(5, scope)) == 3
        assert _batch(store, 3, 3, Fence(9, scope)) == 3  # a new owner took over
        with pytest.raises(FencedOut, match="older token 5"):
            _batch(store, 3, 6, Fence(5, scope))  # the deposed one wakes up
        assert (store.last_position, store.stream_cursor, store.fence) == (6, 6, Fence(9, scope))
        assert _batch(store, 1, 6, Fence(9, scope)) == 1
        # a bucket made again starts its tokens over, under another scope
        assert _batch(store, 1, 7, Fence(1, "KF_RECORDER_LEASE@2026-12-02T00:00:00")) == 1
    finally:
        store.close()
    if kind == "duckdb":
        reopened = DuckDBEventStore(path)
        try:  # the fence is kept beside the cursor, in the file
            assert reopened.fence == Fence(1, "KF_RECORDER_LEASE@2026-12-02T00:00:00")
            assert reopened.stream_cursor == 8
            with pytest.raises(FencedOut):
                _batch(reopened, 1, 8, Fence(0, "KF_RECORDER_LEASE@2026-12-02T00:00:00"))
            assert reopened.last_position == 8
        finally:
            reopened.close()


@pytest.mark.asyncio
async def test_a_url_list_connects_and_reconnects_across_the_cluster(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", size=3) as cluster:
        spaced = ", ".join(cluster.urls) + ","  # as a user may type it
        nc = await connect(spaced, "test", wait_for_server=10)
        try:
            first = nc.connected_url
            assert first is not None
            node = next(i for i, url in enumerate(cluster.urls) if url.endswith(f":{first.port}"))
            cluster.kill(node)  # the node this client is connected to
            deadline = time.monotonic() + 30
            while nc.connected_url in (None, first) or not nc.is_connected:
                assert time.monotonic() < deadline, "no reconnection to another node"
                await asyncio.sleep(0.05)

            async def pong(msg: Msg) -> None:
                await msg.respond(b"pong")

            echo = await nc.subscribe("probe", cb=pong)
            assert (await nc.request("probe", b"ping", timeout=5)).data == b"pong"
            await echo.unsubscribe()
        finally:
            await nc.close()


@pytest.mark.asyncio
async def test_a_hub_with_hub_credentials_stands_by_behind_an_authenticated_hub(
    tmp_path: Path,
) -> None:
    """What a standby on another host runs: `--nats URL --creds hub.nk`."""
    async with running_hub(tmp_path / "a", lease_ttl=TTL) as owner:
        stop = asyncio.Event()
        creds = ClientAuth(seed_path(owner.home, "hub"))
        with structlog.testing.capture_logs() as logs:
            standby = asyncio.create_task(
                _hub_until_stopped(tmp_path / "b", owner.url, creds, stop)
            )
            deadline = time.monotonic() + 30
            while not any(entry["event"].startswith("standby") for entry in logs):
                assert time.monotonic() < deadline and not standby.done(), logs
                await asyncio.sleep(0.05)
        stop.set()
        with pytest.raises(ConnectStopped, match="stopped while waiting"):
            await asyncio.wait_for(standby, 30)
    assert not (tmp_path / "b" / "events.duckdb").exists()


async def _hub_until_stopped(home: Path, url: str, auth: ClientAuth, stop: asyncio.Event) -> None:
    async with running_hub(home, nats_url=url, external_auth=auth, stop=stop, lease_ttl=TTL):
        raise AssertionError("took the lease of a live owner")
