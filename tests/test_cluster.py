"""The local JetStream cluster the fault tests stand on: three routed nodes, a replicated
stream that survives the loss of one node, and a node that comes back on its ports."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import PubAck, StreamConfig
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

from bus.cluster import LocalCluster, wait_for_jetstream
from bus.connection import connect, jetstream
from bus.streams import StreamRefused, ensure_events_stream


async def publish_until_acked(js: JetStreamContext, subject: str, data: bytes) -> PubAck:
    """Publish as the bus's publisher does across a leader election: retry with one
    message id, so a retry of a publish that did land is dropped as a duplicate."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await js.publish(subject, data, timeout=2, headers={"Nats-Msg-Id": subject})
        except (NatsTimeoutError, NoRespondersError, NoStreamResponseError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


@pytest.mark.asyncio
async def test_a_replicated_stream_keeps_every_message_through_a_node_kill(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path, size=3) as cluster:
        await wait_for_jetstream(cluster.urls)
        nc = await connect(cluster.url, "test")
        try:
            js = jetstream(nc)
            info = await js.add_stream(StreamConfig(name="R3", subjects=["r3.>"], num_replicas=3))
            assert info.config.num_replicas == 3
            await js.publish("r3.a", b"before")
            cluster.kill(0)
            assert not cluster.nodes[0].running
            ack = await publish_until_acked(js, "r3.b", b"during")
            assert ack.seq == 2
            cluster.restart(0)
            assert cluster.nodes[0].running
            await publish_until_acked(js, "r3.c", b"after")
        finally:
            await nc.close()

        # Read back through the restarted node alone: every message, the one published
        # while it was down included. A fetch returns what is ready, so fetch until all is.
        only_n1 = await connect(cluster.urls[0], "test")
        try:
            js = jetstream(only_n1, timeout=10)
            await wait_for_jetstream(cluster.urls[0])
            subscription = await js.pull_subscribe("r3.>", durable=None, stream="R3")
            read: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(read) < 3 and time.monotonic() < deadline:
                # a restarted node answers 503 until its replica of the stream is back
                with contextlib.suppress(NatsTimeoutError, ServiceUnavailableError):
                    read += [m.data for m in await subscription.fetch(3 - len(read), timeout=5)]
            assert read == [b"before", b"during", b"after"]
        finally:
            await only_n1.close()


@pytest.mark.asyncio
async def test_two_nodes_cannot_hold_the_events_stream_and_say_so(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, size=2) as cluster:
        await wait_for_jetstream(cluster.url)
        nc = await connect(cluster.url, "two-nodes")
        try:
            with pytest.raises(StreamRefused, match=r"3 replica.*3 or more nodes"):
                await ensure_events_stream(jetstream(nc))
        finally:
            await nc.close()
