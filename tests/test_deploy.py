"""ops/deploy/: the shipped cluster and leaf configurations are valid nats-server
configurations once rendered, and the rendered cluster forms and keeps KF_EVENTS on 3
replicas."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from bus.auth import ClientAuth
from bus.connection import connect, jetstream
from bus.follow import Msg, follow
from bus.server import nats_server_binary
from bus.streams import CLUSTER_REPLICAS, ensure_events_stream
from bus.subjects import STREAM, event_subject
from eventstore.codec import encode
from ops.accounts import seed_path
from ops.deploy.render import SHIPPED, Deployment, Tls, load, render, write
from ops.selfsigned import make_tls
from tests.conftest import started


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
    ports = iter(_free_ports(3 * len(shipped.node) + len(shipped.leaf)))
    nodes = [
        msgspec.structs.replace(
            node,
            host="127.0.0.1",
            listen="127.0.0.1",
            store_dir=str(tmp_path / node.name),
            client_port=next(ports),
            route_port=next(ports),
            leaf_port=next(ports),
        )
        for node in shipped.node
    ]
    leaves = [msgspec.structs.replace(leaf, port=next(ports)) for leaf in shipped.leaf]
    deployment = msgspec.structs.replace(
        shipped, tls=Tls(str(tls.ca), str(tls.cert), str(tls.key)), node=nodes, leaf=leaves
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
        assert path.stat().st_mode & 0o077 == 0  # the leaf's holds its seed
    node = (tmp_path / "rendered" / "n1.conf").read_text()
    assert "sync_interval: always" in node and "verify: true" in node


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
        assert len(written) == 4
        yield deployment.client_urls().replace("nats://", "tls://"), home, ca
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)


@pytest.mark.asyncio
async def test_the_rendered_cluster_keeps_events_on_three_replicas(
    cluster: tuple[str, Path, Path],
) -> None:
    urls, home, ca = cluster
    admin = await connect(urls, "kf-admin", auth=ClientAuth(seed_path(home, "admin"), ca))
    try:
        js = jetstream(admin, timeout=1.0)
        deadline = time.monotonic() + 60
        while True:  # the JetStream meta group elects its leader first
            try:
                info = await ensure_events_stream(js)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.25)
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
        info = await js.stream_info(STREAM)
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2
        arrived: asyncio.Queue[bytes] = asyncio.Queue()

        async def keep(message: Msg) -> None:
            await arrived.put(message.data)

        following = await follow(cli, "kf.ev.deployed.>", keep)
        assert await asyncio.wait_for(arrived.get(), 10) == encode(event)
        await following.stop()
    finally:
        await cli.close()
