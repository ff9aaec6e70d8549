"""ops/deploy/: the shipped cluster configurations are valid nats-server configurations
once rendered, and the rendered cluster forms and keeps KF_EVENTS on 3 replicas."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest

from bus.auth import ClientAuth
from bus.connection import connect, jetstream
from bus.follow import Msg, follow
from bus.lease import DEVICE_LEASES, RECORDER_LEASES, ensure_lease_bucket
from bus.server import nats_server_binary
from bus.streams import CLUSTER_REPLICAS, ensure_events_stream
from bus.subjects import STREAM, event_subject
from eventstore.codec import encode
from ops.accounts import seed_path
from ops.deploy.render import (
    SHIPPED,
    Deployment,
    Tls,
    load,
    on_this_host,
    ports_needed,
    render,
    write,
)
from ops.selfsigned import make_tls
from tests.conftest import started
from tests.test_swarm import campaign_file

T = TypeVar("T")


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _on_this_host(tmp_path: Path) -> tuple[Deployment, Path]:
    """The shipped cluster.toml with this machine's TLS files, store dirs and ports."""
    tls = make_tls(tmp_path / "tls")
    shipped = load(SHIPPED)
    deployment = on_this_host(
        shipped,
        tmp_path,
        Tls(str(tls.ca), str(tls.cert), str(tls.key)),
        _free_ports(ports_needed(shipped)),
    )
    return deployment, tls.ca


def _check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(nats_server_binary()), "-t", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_shipped_config_is_valid_once_rendered(tmp_path: Path) -> None:
    deployment, _ = _on_this_host(tmp_path)
    written = write(render(deployment, tmp_path / "home"), tmp_path / "rendered")
    names = sorted(path.name for path in written)
    assert names == ["leaf-gpu1.conf", "n1.conf", "n2.conf", "n3.conf"]
    for path in written:
        checked = _check(path)
        assert checked.returncode == 0, f"{path.name}: {checked.stderr}"
        assert path.stat().st_mode & 0o077 == 0
    node = (tmp_path / "rendered" / "n1.conf").read_text()
    assert 'sync_interval: "always"' in node and "verify: true" in node


def test_a_broken_config_fails_the_check(tmp_path: Path) -> None:
    """The check above can fail: nats-server refuses what it cannot use."""
    deployment, _ = _on_this_host(tmp_path)
    broken = msgspec.structs.replace(
        deployment, tls=msgspec.structs.replace(deployment.tls, cert=str(tmp_path / "none"))
    )
    written = write(render(broken, tmp_path / "home"), tmp_path / "rendered")
    assert _check(written[0]).returncode != 0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """The rendered 3 nodes running here: (client URLs, run folder, CA)."""
    deployment, ca = _on_this_host(tmp_path)
    home = tmp_path / "home"
    written = write(render(deployment, home), tmp_path / "rendered")
    processes = []
    try:
        for node in deployment.node:
            config = tmp_path / "rendered" / f"{node.name}.conf"
            log = tmp_path / f"{node.name}.log"
            processes.append(
                subprocess.Popen(
                    [str(nats_server_binary()), "-c", str(config), "-l", str(log)],
                    stdin=subprocess.DEVNULL,
                )
            )
        assert len(written) == 4  # and the leaf node's, started by tests/test_leaf.py
        yield deployment.client_urls().replace("nats://", "tls://"), home, ca
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)


async def _until(attempt: Callable[[], Awaitable[T]], within: float = 60.0) -> T:
    """`attempt()` once it succeeds: a cluster answers once its JetStream meta group, then
    a stream's own group, have elected their leaders (slower on a busy host); a leaf once
    it has joined."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await attempt()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)


@pytest.mark.asyncio
async def test_the_rendered_cluster_keeps_events_on_three_replicas(
    cluster: tuple[str, Path, Path],
) -> None:
    urls, home, ca = cluster
    admin = await connect(urls, "kf-admin", auth=ClientAuth(seed_path(home, "admin"), ca))
    try:
        js = jetstream(admin, timeout=1.0)
        info = await _until(lambda: ensure_events_stream(js))
        assert info.config.num_replicas == CLUSTER_REPLICAS
    finally:
        await admin.close()
    cli = await connect(urls, "kf-cli", auth=ClientAuth(seed_path(home, "cli"), ca))
    try:
        js = jetstream(cli)
        event = started("deployed")
        ack = await js.publish(
            event_subject("deployed", "CampaignStarted"),
            encode(event),
            headers={"Nats-Msg-Id": str(event.event_id)},
        )
        assert ack.stream == STREAM
        info = await _until(lambda: js.stream_info(STREAM))
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2
        arrived: asyncio.Queue[bytes] = asyncio.Queue()

        async def keep(message: Msg) -> None:
            await arrived.put(message.data)

        following = await follow(cli, "kf.ev.deployed.>", keep)
        assert await asyncio.wait_for(arrived.get(), 10) == encode(event)
        await following.stop()
    finally:
        await cli.close()


def _kfactory(home: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def _create_stream(urls: str, home: Path, ca: Path) -> None:
    admin = await connect(urls, "kf-admin", auth=ClientAuth(seed_path(home, "admin"), ca))
    js = jetstream(admin, timeout=1.0)
    deadline = time.monotonic() + 60
    while True:  # the JetStream meta group elects its leader first
        try:
            events = await ensure_events_stream(js)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)
    for bucket in (RECORDER_LEASES, DEVICE_LEASES):  # the hub user only checks they exist
        await ensure_lease_bucket(js, bucket, replicas=events.config.num_replicas or 1)
    await admin.close()


@pytest.mark.slow  # a campaign across the cluster, the hub and a swarm of seven processes
@pytest.mark.timeout(900)
def test_a_swarm_runs_a_campaign_on_the_rendered_cluster(
    cluster: tuple[str, Path, Path], tmp_path: Path
) -> None:
    urls, home, ca = cluster
    asyncio.run(_create_stream(urls, home, ca))  # the hub, with only the hub's seed, checks them
    creds = home / "creds"
    recording = tmp_path / "recording"
    hub = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "server", "--nats", urls, "--tls-ca", str(ca),
         "--creds", str(creds / "hub.nk"), "--home", str(recording)],
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "hub.log").open("wb"),
    )  # fmt: skip
    swarm = tmp_path / "swarm.toml"
    roles = ("planner", "kernel-writer", "fuser", "librarian", "verifier", "benchmarker")
    swarm.write_text(
        f'nats = "{urls}"\ncreds = "{creds}"\ntls_ca = "{ca}"\n'
        + "".join(f'[[actor]]\nrole = "{role}"\n' for role in roles)
    )
    workers = tmp_path / "workers"
    try:
        up = _kfactory(workers, "up", "--config", str(swarm), "--detach")
        assert up.returncode == 0, up.stderr
        run = _kfactory(
            tmp_path / "cli",
            "run", str(campaign_file(tmp_path, "clustered", budget=4, per_generation=4)),
            "--nats", urls, "--creds", str(creds / "cli.nk"), "--tls-ca", str(ca),
            "--json", "--no-local-actors",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["evaluated"] == 4
        counted = _kfactory(
            tmp_path / "cli",
            "sql", "SELECT type, count(*) AS n FROM events GROUP BY type", "-f", "json",
            "--nats", urls, "--creds", str(creds / "cli.nk"), "--tls-ca", str(ca),
        )  # fmt: skip
        assert counted.returncode == 0, counted.stderr
        counts = {row["type"]: row["n"] for row in json.loads(counted.stdout)}
        assert counts["CampaignFinished"] == 1 and counts["BenchmarkCompleted"] >= 1, counts
        assert "EventRejected" not in counts and "DeadLettered" not in counts, counts
    finally:
        down = _kfactory(workers, "down")
        hub.terminate()
        hub.wait(60)
    assert down.returncode == 0, down.stderr
