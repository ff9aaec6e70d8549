"""A GPU host's leaf node (ops/deploy): actors on it reach the cluster's JetStream through
the domain, and the leaf keeps each role to its own permissions. Real nats-servers: the
rendered 3-node cluster and the rendered leaf node, all on this host."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import nkeys
import pytest
from nats.js.errors import NotFoundError

from actors.roles.registry import ROLES
from actors.runtime import durable_name
from bus.auth import ClientAuth, create_seed_file
from bus.connection import JS_DOMAIN_ENV, Client, connect, jetstream
from bus.follow import Msg, follow
from bus.heartbeat import collect, heartbeat_subject
from bus.lease import DEVICE_LEASES, LeaseBucket, ensure_lease_bucket
from bus.server import nats_server_binary
from bus.streams import ensure_consumer, ensure_events_stream, work_consumer_config
from bus.subjects import STREAM, event_subject
from ops.accounts import seed_path
from ops.deploy.render import Deployment, leaf_seed, render, write
from tests.test_deploy import _check, _on_this_host, _until

CAMPAIGN = "leafed"


class LeafSetup(NamedTuple):
    cluster_urls: str
    leaf_url: str
    home: Path
    ca: Path
    domain: str


@contextlib.contextmanager
def _running(tmp_path: Path, *, with_leaf: bool = True) -> Iterator[tuple[Deployment, LeafSetup]]:
    """The rendered cluster (and its rendered GPU leaf node), running here."""
    deployment, ca = _on_this_host(tmp_path)
    home = tmp_path / "home"
    write(render(deployment, home), tmp_path / "rendered")
    names = [node.name for node in deployment.node]
    if with_leaf:
        names += [f"leaf-{leaf.name}" for leaf in deployment.leaf]
    processes = [
        subprocess.Popen(
            [
                str(nats_server_binary()),
                "-c",
                str(tmp_path / "rendered" / f"{name}.conf"),
                "-l",
                str(tmp_path / f"{name}.log"),
            ],
            stdin=subprocess.DEVNULL,
        )
        for name in names
    ]
    try:
        (leaf,) = deployment.leaf
        yield (
            deployment,
            LeafSetup(
                deployment.client_urls().replace("nats://", "tls://"),
                f"nats://127.0.0.1:{leaf.client_port}",
                home,
                ca,
                deployment.cluster.domain,
            ),
        )
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)


@pytest.fixture
def leafed(tmp_path: Path) -> Iterator[LeafSetup]:
    with _running(tmp_path) as (_, setup):
        yield setup


def test_the_rendered_leaf_node_is_valid_and_has_no_jetstream(tmp_path: Path) -> None:
    deployment, _ = _on_this_host(tmp_path)
    written = write(render(deployment, tmp_path / "home"), tmp_path / "rendered")
    (leaf,) = [path for path in written if path.name.startswith("leaf-")]
    checked = _check(leaf)
    assert checked.returncode == 0, checked.stderr
    text = leaf.read_text()
    assert not re.search(r"^\s*jetstream\b", text, re.MULTILINE | re.IGNORECASE)
    assert text.count("tls://127.0.0.1:") == 3 and leaf.stat().st_mode & 0o077 == 0
    node = (tmp_path / "rendered" / "n1.conf").read_text()
    assert f'domain: "{deployment.cluster.domain}"' in node and "leafnodes {" in node


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_actors_on_a_leaf_node_use_the_clusters_jetstream(leafed: LeafSetup) -> None:
    urls, leaf_url, home, ca, domain = leafed
    target = (ROLES["verifier"].targets or ("cpu",))[0]
    work = event_subject(CAMPAIGN, "KernelCompiled", target)
    consumer = durable_name("verifier", target)

    admin = await connect(urls, "kf-admin", auth=ClientAuth(seed_path(home, "admin"), ca))
    cli = await connect(urls, "kf-cli", auth=ClientAuth(seed_path(home, "cli"), ca))
    opened: list[Client] = []
    refusals: list[str] = []

    async def leaf_client(role: str) -> Client:
        async def note(exc: Exception) -> None:
            refusals.append(f"{role}: {exc}")

        nc = await connect(leaf_url, f"kf-{role}", auth=ClientAuth(seed_path(home, role)))
        nc._error_cb = note  # keep the server's -ERR lines for the assertions below
        opened.append(nc)
        return nc

    try:
        plain = jetstream(admin, timeout=2.0)
        await _until(lambda: ensure_events_stream(plain))
        await ensure_lease_bucket(plain, DEVICE_LEASES, replicas=3)
        await ensure_consumer(
            plain, work_consumer_config(consumer, [work], max_deliver=5, ack_wait=30)
        )
        # the cluster's users may address the domain too (KF_JS_DOMAIN set on any host)
        info = await jetstream(cli, timeout=2.0, domain=domain).stream_info(STREAM)
        assert info.config.name == STREAM
        verifier = await leaf_client("verifier")
        benchmarker = await leaf_client("benchmarker")
        js = jetstream(verifier, timeout=2.0, domain=domain)
        assert (await _until(lambda: js.stream_info(STREAM))).config.name == STREAM

        # an event published on the leaf lands in KF_EVENTS
        verified = event_subject(CAMPAIGN, "KernelVerified", target)
        ack = await js.publish(verified, b"verified on the leaf")
        assert ack.stream == STREAM
        stored = await plain.get_msg(STREAM, subject=verified)
        assert stored.data == b"verified on the leaf" and stored.seq == ack.seq

        # work published on the cluster is pulled and acknowledged on the leaf
        await plain.publish(work, b"compiled")
        pulled = await js.pull_subscribe_bind(durable=consumer, stream=STREAM)
        (message,) = await pulled.fetch(1, timeout=10)
        assert message.data == b"compiled"
        await message.ack_sync()
        assert (await plain.consumer_info(STREAM, consumer)).num_ack_pending == 0

        # a heartbeat watcher that starts after the leaf joined hears the leaf's actors
        beats = await cli.subscribe("kf.hb.*.*")
        await cli.flush()

        async def beat_heard() -> bytes:
            await verifier.publish(heartbeat_subject("verifier", "gpu1-0"), b"beat")
            return (await beats.next_msg(timeout=0.5)).data

        assert await _until(beat_heard, within=20) == b"beat"

        # a device lease is taken and renewed through the leaf, and seen from the cluster
        leases = await LeaseBucket.open(
            jetstream(benchmarker, timeout=2.0, domain=domain), DEVICE_LEASES, ttl=30
        )
        lease = await leases.try_acquire("gpu1-0", "benchmarker@gpu1")
        assert lease is not None
        renewed = await leases.renew(lease)
        assert renewed.revision > lease.revision and renewed.token == lease.token
        from_cluster = await LeaseBucket.open(plain, DEVICE_LEASES, ttl=30)
        held = await from_cluster.current("gpu1-0")
        assert held is not None and held.holder == "benchmarker@gpu1"
        assert held.token == lease.token
        assert await from_cluster.try_acquire("gpu1-0", "another") is None
        assert await leases.release(renewed)
        # and so may a benchmarker connected to the cluster itself, in the domain
        direct = await connect(
            urls, "kf-benchmarker", auth=ClientAuth(seed_path(home, "benchmarker"), ca)
        )
        opened.append(direct)
        in_domain = await LeaseBucket.open(
            jetstream(direct, timeout=2.0, domain=domain), DEVICE_LEASES, ttl=30
        )
        lease = await in_domain.try_acquire("n1-cpu", "benchmarker@n1")
        assert lease is not None and await in_domain.renew(lease)

        # the leaf refuses a role what its role may not publish, though its user on the
        # cluster (verifier and benchmarker together) may
        benchmarked = event_subject(CAMPAIGN, "BenchmarkCompleted", target)
        with pytest.raises(Exception):  # noqa: B017 (refused: no stream ever answers)
            await js.publish(benchmarked, b"not the verifier's to say", timeout=1.0)
        with pytest.raises(NotFoundError):
            await plain.get_msg(STREAM, subject=benchmarked)
        assert any(
            "verifier" in r
            and "permissions violation" in r.lower()
            and benchmarked.lower() in r.lower()
            for r in refusals
        ), refusals
        # the benchmarker may: the same subject goes through for its user
        bench_js = jetstream(benchmarker, timeout=2.0, domain=domain)
        assert (await bench_js.publish(benchmarked, b"benchmarked")).stream == STREAM
    finally:
        for nc in (*opened, cli, admin):
            await nc.close()


def _leaf_connection(host: str, port: int, ca: Path, seed_file: Path) -> ssl.SSLSocket:
    """A bare leaf connection as the user of `seed_file`: it enforces nothing itself."""
    raw = socket.create_connection((host, port), timeout=10)
    info = b""
    while not info.endswith(b"\r\n"):  # INFO comes in the clear, then TLS
        info += raw.recv(1)
    nonce = json.loads(info.removeprefix(b"INFO "))["nonce"]
    tls = ssl.create_default_context(cafile=str(ca)).wrap_socket(raw, server_hostname=host)
    keys = nkeys.from_seed(bytearray(seed_file.read_bytes().strip()))
    signed = base64.urlsafe_b64encode(keys.sign(nonce.encode())).rstrip(b"=").decode()
    connect_line = {"nkey": keys.public_key.decode(), "sig": signed, "name": "bare", "proto": 1}
    tls.sendall(f"CONNECT {json.dumps(connect_line)}\r\nPING\r\n".encode())
    return tls


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_the_cluster_itself_refuses_a_leaf_what_its_roles_may_not_publish(
    tmp_path: Path,
) -> None:
    """A leaf whose own checks are gone (here a bare connection with the leaf's seed) can
    publish what its roles may, and the cluster refuses the rest; a leaf with a seed the
    cluster does not know is refused at once."""
    with _running(tmp_path, with_leaf=False) as (deployment, setup):
        admin = await connect(
            setup.cluster_urls,
            "kf-admin",
            auth=ClientAuth(seed_path(setup.home, "admin"), setup.ca),
        )
        try:
            plain = jetstream(admin, timeout=2.0)
            await _until(lambda: ensure_events_stream(plain))
            node = deployment.node[0]
            stranger = tmp_path / "stranger.nk"  # a seed the cluster does not know
            create_seed_file(stranger)
            refused = _leaf_connection("127.0.0.1", node.leaf_port, setup.ca, stranger)
            try:
                refused.settimeout(10)
                assert b"Authorization Violation" in refused.recv(4096)
            finally:
                refused.close()
            bare = _leaf_connection(
                "127.0.0.1", node.leaf_port, setup.ca, leaf_seed(setup.home, deployment.leaf[0])
            )
            try:
                for event_type in ("KernelVerified", "CampaignFinished"):  # a planner's
                    subject = event_subject(CAMPAIGN, event_type)
                    bare.sendall(f"LMSG {subject} 4\r\nbare\r\n".encode())
                    await asyncio.sleep(0.5)

                async def verified() -> bytes:
                    found = await plain.get_msg(
                        STREAM, subject=event_subject(CAMPAIGN, "KernelVerified")
                    )
                    return found.data or b""

                assert await _until(verified, within=20) == b"bare"
                with pytest.raises(NotFoundError):
                    await plain.get_msg(STREAM, subject=event_subject(CAMPAIGN, "CampaignFinished"))
            finally:
                bare.close()
        finally:
            await admin.close()
        log = (tmp_path / f"{node.name}.log").read_text()
        assert f'Publish Violation on "{event_subject(CAMPAIGN, "CampaignFinished")}"' in log


@pytest.mark.slow  # two actor processes (interpreter start and imports dominate)
@pytest.mark.asyncio
@pytest.mark.timeout(400)
async def test_actor_processes_on_the_leaf_start_and_beat(
    leafed: LeafSetup, tmp_path: Path
) -> None:
    """`kfactory actor verifier|benchmarker` on the GPU host's leaf, with KF_JS_DOMAIN: each
    creates its work consumer, announces itself in KF_EVENTS, and is seen alive."""
    urls, leaf_url, home, ca, domain = leafed
    admin = await connect(urls, "kf-admin", auth=ClientAuth(seed_path(home, "admin"), ca))
    cli = await connect(urls, "kf-cli", auth=ClientAuth(seed_path(home, "cli"), ca))
    roles = ("verifier", "benchmarker")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        plain = jetstream(admin, timeout=2.0)
        await _until(lambda: ensure_events_stream(plain))
        started: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def keep(message: Msg) -> None:
            await started.put(msgspec.json.decode(message.data))

        following = await follow(admin, "kf.ev.*.ActorStarted", keep)
        processes += [_start_actor(role, leaf_url, home, domain, tmp_path) for role in roles]
        announced = set()
        while announced != set(roles):
            event = await asyncio.wait_for(started.get(), 300)
            announced.add(event["actor"]["role"])
        await following.stop()
        for role in roles:
            target = (ROLES[role].targets or ("cpu",))[0]
            name = durable_name(role, target)  # created right after ActorStarted
            info = await _until(lambda: plain.consumer_info(STREAM, name), within=60)  # noqa: B023
            assert info.config.durable_name == name
        alive = await _until(lambda: _all_beating(cli, roles), within=60)
        assert {role for role, _ in alive} == set(roles)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(60)
        await cli.close()
        await admin.close()
    for role in roles:
        log = (tmp_path / f"{role}.log").read_text()
        assert "permissions violation" not in log.lower(), log


def _start_actor(
    role: str, leaf_url: str, home: Path, domain: str, tmp_path: Path
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "ops.cli", "actor", role, "--nats", leaf_url]
    command += ["--creds", str(seed_path(home, role)), "--home", str(tmp_path / f"gpu-{role}")]
    return subprocess.Popen(
        command,
        env={**os.environ, JS_DOMAIN_ENV: domain},
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / f"{role}.log").open("wb"),
    )


async def _all_beating(cli: Client, roles: tuple[str, ...]) -> set[tuple[str, str]]:
    alive = set(await collect(cli, wait=1.5))
    if {role for role, _ in alive} != set(roles):
        raise AssertionError(f"alive so far: {alive}")
    return alive
