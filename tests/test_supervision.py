"""Supervision against a real nats-server: heartbeats and `kfactory ps`, the hub that
restarts its nats-server on a port kept in the run folder, connections that a stop ends
and that give up (or keep waiting) as they should."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path

import msgspec
import pytest
import structlog
from typer.testing import CliRunner

from actors.runtime import Actor, ActorRuntime, Reactions
from bus import connection
from bus.connection import Client, ConnectStopped, connect, jetstream
from bus.device_lease import DeviceLeases, device_key
from bus.heartbeat import Heartbeat, collect
from eventstore.emitter import Emitter
from eventstore.events import ActorRef, Event, KernelVerified, new_event
from ops.cli import app
from ops.hub import Hub, port_file, running_hub
from tests.conftest import started

UNREACHABLE = "nats://127.0.0.1:1"


DEVICE = device_key("cpu", "test-host")


class LeaseWaiter(Actor):
    """Waits for the device's lease the way the benchmarker does."""

    role = "benchmarker"
    target = "cpu"
    reacts_to = (KernelVerified,)

    def __init__(self) -> None:
        self.device = "test cpu"
        self.leases: DeviceLeases | None = None

    async def setup(self, nc: Client, ref: ActorRef) -> None:
        self.leases = await DeviceLeases.open(jetstream(nc), ref.instance)

    async def handle(self, event: Event, out: Reactions) -> None:
        assert self.leases is not None
        async with self.leases.timing(DEVICE, self.status):
            pass


async def _wait_for(check, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


@pytest.mark.asyncio
async def test_ps_shows_a_live_actor_and_the_device_lease_it_waits_for(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with running_hub(home) as hub:
        nc = await connect(hub.url, "bench", auth=hub.auth("benchmarker"))
        cli = await connect(hub.url, "verifier", auth=hub.auth("verifier"))
        rival = await connect(hub.url, "bench-3", auth=hub.auth("benchmarker"))
        other = await DeviceLeases.open(jetstream(rival), "benchmarker-3")
        holder = await other.leases.try_acquire(f"{DEVICE}.timing", "benchmarker-3")
        assert holder is not None  # another benchmarker times on the device
        waiting = f"waiting for the lease on {DEVICE}, held by benchmarker-3"
        stop = asyncio.Event()
        runtime = ActorRuntime(LeaseWaiter(), nc, "benchmarker-7")
        task = asyncio.create_task(runtime.run(stop))
        verified = new_event(
            KernelVerified,
            campaign_id="c-lock",
            actor=ActorRef.here("verifier"),
            problem="softmax",
            target="cpu",
            candidate_id="c-lock:g0:c0",
            generation=0,
            source_hash="0" * 64,
            max_rel_err=0.0,
            trials=1,
        )
        try:
            await asyncio.wait_for(Emitter(jetstream(cli)).emit(verified), 30)
            await _wait_for(lambda: _state_is(runtime, waiting))
            done = await asyncio.to_thread(
                CliRunner().invoke, app, ["ps", "--home", str(home), "--json"]
            )
            assert done.exit_code == 0, done.output
            shown = json.loads(done.stdout)
            (actor,) = [a for a in shown["actors"] if a["instance"] == "benchmarker-7"]
            assert actor["role"] == "benchmarker"
            assert actor["host"] == os.uname().nodename
            assert actor["target"] == "cpu"
            assert actor["device"] == "test cpu"
            assert actor["job"] == "KernelVerified c-lock:g0:c0"
            assert actor["state"] == waiting
            assert 0 <= actor["last_seen_s"] < 15
            (queue,) = [q for q in shown["queues"] if q["consumer"] == "kf-benchmarker-cpu"]
            assert queue["in_flight"] == 1 and queue["instances"] == 1

            table = await asyncio.to_thread(CliRunner().invoke, app, ["ps", "--home", str(home)])
            assert "benchmarker-7" in table.stdout and "waiting for the" in table.stdout
            await other.leases.release(holder)
            await _wait_for(lambda: _state_is(runtime, "idle"))
        finally:
            await other.leases.release(holder)
            stop.set()
            await asyncio.wait_for(task, 30)
            await nc.close()
            await cli.close()
            await rival.close()


async def _state_is(runtime: ActorRuntime, state: str) -> bool:
    return runtime.heartbeat().state == state


@pytest.mark.asyncio
async def test_a_role_may_only_beat_as_itself(tmp_path: Path) -> None:
    async with running_hub(tmp_path / "home") as hub:
        cli = await connect(hub.url, "cli", auth=hub.auth("cli"))
        impostor = await connect(hub.url, "impostor", auth=hub.auth("verifier"))
        try:
            seen = asyncio.create_task(collect(cli, wait=1.5))
            await asyncio.sleep(0.5)
            for role, instance in (("planner", "planner-2"), ("verifier", "verifier-1")):
                beat = Heartbeat(role=role, instance=instance, host="h", pid=1)
                await impostor.publish(f"kf.hb.{role}.{instance}", msgspec.json.encode(beat))
            found = await seen
            assert list(found) == [("verifier", "verifier-1")], found
        finally:
            await impostor.close()
            await cli.close()


@pytest.mark.asyncio
async def test_the_hub_restarts_a_dead_nats_server_on_the_same_port(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with running_hub(home) as hub:
        cli = await connect(hub.url, "cli", auth=hub.auth("cli"))
        emitter = Emitter(jetstream(cli))
        try:
            await asyncio.wait_for(emitter.emit(started("before")), 30)
            await hub.wait_for_position(1, timeout=30)
            assert hub.server is not None and hub.server.pid is not None
            url, first_pid = hub.url, hub.server.pid
            os.kill(first_pid, signal.SIGKILL)
            await _wait_for(lambda: _restarted(hub, first_pid))
            assert hub.server.url == url
            # Clients and the recorder reconnect to the same URL: nothing is lost.
            await asyncio.wait_for(emitter.emit(started("after")), 30)
            await hub.wait_for_position(2, timeout=30)
        finally:
            await cli.close()
        rows = hub.store.query("SELECT campaign_id FROM events ORDER BY position").rows
        assert rows == [["before"], ["after"]]


async def _restarted(hub: Hub, old_pid: int) -> bool:
    assert hub.server is not None
    return hub.server.running and hub.server.pid != old_pid


@pytest.mark.asyncio
async def test_a_restarted_hub_keeps_its_url(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with running_hub(home) as hub:
        first = hub.url
    assert port_file(home).read_text().strip() == first.rsplit(":", 1)[1]
    async with running_hub(home) as hub:
        assert hub.url == first


@pytest.mark.asyncio
async def test_connect_gives_up_naming_the_url() -> None:
    started_at = time.monotonic()
    with pytest.raises(ConnectionError, match=re.escape(f"{UNREACHABLE} after 1 s")):
        await connect(UNREACHABLE, "interactive", wait_for_server=1.0)
    assert time.monotonic() - started_at < 30  # it gave up (generous: a busy host)


@pytest.mark.asyncio
async def test_an_actor_waits_for_the_hub_saying_so_until_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection, "WAITING_LOG_EVERY", 0.3)
    stop = asyncio.Event()
    with structlog.testing.capture_logs() as logs:
        waiting = asyncio.create_task(
            connect(UNREACHABLE, "actor", wait_for_server=None, stop=stop)
        )
        await asyncio.sleep(1.5)
        assert not waiting.done()
        stop.set()
        with pytest.raises(ConnectStopped):
            await asyncio.wait_for(waiting, 10)
    said = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert len(said) >= 2 and set(said) == {f"waiting for the hub at {UNREACHABLE}"}
