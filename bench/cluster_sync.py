"""What `sync_interval: always` costs on the shipped 3-node cluster, here on one machine.

Usage: PYTHONPATH=$PWD .venv/bin/python bench/cluster_sync.py [--events 300]

Renders ops/deploy/cluster.toml for 127.0.0.1 twice, once with the shipped
`sync_interval` and once with nats-server's default (2m); on each it creates KF_EVENTS
(3 replicas) and publishes `--events` events one at a time, each waiting for its ack (as
an actor's publisher does), then the same number at once (as `publish_many` does). Prints
the ack latency (p50, p99) and the burst's rate for each.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import msgspec

from bus.auth import ClientAuth
from bus.connection import connect, jetstream
from bus.server import nats_server_binary
from bus.streams import ensure_events_stream
from bus.subjects import event_subject
from eventstore.codec import encode
from eventstore.events import ActorRef, CampaignStarted, new_event
from ops.accounts import seed_path
from ops.deploy.render import SHIPPED, Tls, load, on_this_host, render, write
from ops.selfsigned import make_tls

CLI = ActorRef(role="cli", instance="bench", host="localhost")


def _ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


async def _measure(urls: str, home: Path, ca: Path, events: int) -> dict[str, float]:
    admin = await connect(urls, "bench-admin", auth=ClientAuth(seed_path(home, "admin"), ca))
    js = jetstream(admin, timeout=1.0)
    deadline = time.monotonic() + 60
    while True:
        try:
            info = await ensure_events_stream(js)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)
    assert info.config.num_replicas == 3
    await admin.close()
    cli = await connect(urls, "bench-cli", auth=ClientAuth(seed_path(home, "cli"), ca))
    js = jetstream(cli, timeout=30.0)

    def event() -> tuple[str, bytes, dict[str, str]]:
        made = new_event(
            CampaignStarted,
            campaign_id="bench",
            actor=CLI,
            name="b",
            problem="softmax",
            target="cpu",
        )
        subject = event_subject("bench", "CampaignStarted")
        return subject, encode(made), {"Nats-Msg-Id": str(made.event_id)}

    latencies = []
    for _ in range(events):
        subject, data, headers = event()
        started = time.perf_counter()
        await js.publish(subject, data, headers=headers)
        latencies.append(time.perf_counter() - started)
    burst = [event() for _ in range(events)]
    started = time.perf_counter()
    await asyncio.gather(*(js.publish(s, d, headers=h) for s, d, h in burst))
    took = time.perf_counter() - started
    await cli.close()
    latencies.sort()
    return {
        "ack_p50_ms": 1000 * statistics.median(latencies),
        "ack_p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "burst_per_s": events / took,
    }


def run(sync_interval: str, events: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        tls = make_tls(base / "tls")
        shipped = load(SHIPPED)
        deployment = on_this_host(
            msgspec.structs.replace(
                shipped,
                cluster=msgspec.structs.replace(shipped.cluster, sync_interval=sync_interval),
            ),
            base,
            Tls(str(tls.ca), str(tls.cert), str(tls.key)),
            _ports(2 * len(shipped.node)),
        )
        home = base / "home"
        write(render(deployment, home), base / "rendered")
        nodes = [
            subprocess.Popen(
                [
                    str(nats_server_binary()),
                    "-c",
                    str(base / "rendered" / f"{n.name}.conf"),
                    "-l",
                    str(base / f"{n.name}.log"),
                ]
            )
            for n in deployment.node
        ]
        try:
            urls = deployment.client_urls().replace("nats://", "tls://")
            return asyncio.run(_measure(urls, home, tls.ca, events))
        finally:
            for node in nodes:
                node.terminate()
            for node in nodes:
                node.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300)
    args = parser.parse_args()
    shipped = load(SHIPPED).cluster.sync_interval
    for setting in (shipped, "2m"):
        figures = run(setting, args.events)
        print(
            f"sync_interval {setting:>6}: ack p50 {figures['ack_p50_ms']:.2f} ms, "
            f"p99 {figures['ack_p99_ms']:.2f} ms; burst {figures['burst_per_s']:.0f} events/s"
        )


if __name__ == "__main__":
    main()
