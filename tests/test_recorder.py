"""The recorder against a real nats-server and a real DuckDB file."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig

from bus.connection import Client, connect, jetstream
from bus.publisher import MSG_ID_HEADER
from bus.server import EmbeddedNatsServer
from bus.streams import ensure_events_stream
from bus.subjects import STREAM, event_subject
from eventstore.codec import encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.emitter import Emitter
from eventstore.queries import StoreUnavailable, status
from ops.hub import Hub
from tests.conftest import calibrated, started


def rows(hub: Hub, sql: str) -> list[list[object]]:
    return hub.store.query(sql).rows


@pytest.mark.asyncio
async def test_an_event_published_twice_is_stored_once(hub: Hub) -> None:
    event = started()
    emitter = Emitter(jetstream(hub.nc))
    await emitter.emit(event)
    await emitter.emit(event)  # same Nats-Msg-Id: JetStream drops it
    subject = event_subject(event.campaign_id, event.type)
    for _ in range(2):  # no header: both reach the stream, the store drops one
        await hub.nc.publish(subject, encode(event))
    marker = calibrated()
    await emitter.emit(marker)
    await hub.wait_for_position(2)
    await asyncio.sleep(0.3)
    assert rows(hub, f"SELECT count(*) FROM events WHERE event_id = '{event.event_id}'") == [[1]]
    assert hub.store.last_position == 2
    assert hub.recorder.stats.duplicates == 2


@pytest.mark.asyncio
async def test_malformed_messages_become_rejections_and_the_recorder_lives_on(hub: Hub) -> None:
    good = started("c1")
    misfit = started("c1")
    bad_messages = [
        ("kf.ev.c1.CampaignStarted", b"\xff\xfe not json", None, "not JSON"),
        ("kf.ev.c1.Nonsense", b'{"type": "Nonsense", "event_id": "x"}', None, "unknown event"),
        (
            "kf.ev.c1.CampaignFinished",
            b'{"type": "CampaignFinished", "campaign_id": "c1"}',
            None,
            "missing required field",
        ),
        ("kf.ev.other.CampaignStarted", encode(misfit), None, "does not match the event"),
        ("kf.ev.c1.CampaignStarted", encode(misfit), "not-its-id", "differs from event_id"),
        ("kf.ev.c1.CampaignStarted", b"{" + b" " * 600_000 + b"}", None, "byte cap"),
    ]
    for subject, data, msg_id, _ in bad_messages:
        await hub.nc.publish(subject, data, headers={MSG_ID_HEADER: msg_id} if msg_id else None)
    await Emitter(jetstream(hub.nc)).emit(good)
    await hub.wait_for_position(7)
    rejected = rows(
        hub,
        "SELECT payload->>'subject', payload->>'reason', campaign_id FROM events "
        "WHERE type = 'EventRejected' ORDER BY payload->>'stream_seq'",
    )
    assert len(rejected) == len(bad_messages)
    for (subject, _, _, expected), (got_subject, reason, campaign) in zip(
        bad_messages, rejected, strict=True
    ):
        assert got_subject == subject
        assert expected in str(reason), (subject, reason)
        assert campaign == subject.split(".")[2]
    stored = rows(hub, "SELECT event_id FROM events WHERE type = 'CampaignStarted'")
    assert stored == [[good.event_id]]
    assert hub.store.verify_chain().ok


@pytest.mark.asyncio
async def test_a_message_that_exhausts_its_deliveries_is_dead_lettered(hub: Hub) -> None:
    js = jetstream(hub.nc)
    cause = started()
    await Emitter(js).emit(cause)
    await js.add_consumer(
        STREAM,
        ConsumerConfig(
            durable_name="kf-doomed",
            ack_policy=AckPolicy.EXPLICIT,
            filter_subject="kf.ev.*.CampaignStarted",
            max_deliver=2,
            ack_wait=0.5,
        ),
    )
    worker = await js.pull_subscribe_bind(durable="kf-doomed", stream=STREAM)
    for _ in range(2):  # a worker that takes the message and dies each time
        (taken,) = await worker.fetch(1, timeout=5)
        assert taken.data == encode(cause)
        await asyncio.sleep(0.7)
    with pytest.raises(NatsTimeout):  # the server gives up on it rather than redeliver
        await worker.fetch(1, timeout=1.5)
    await worker.unsubscribe()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = rows(
            hub,
            "SELECT payload->>'consumer', payload->>'deliveries', "
            "payload->>'original_event_id', campaign_id FROM events WHERE type = 'DeadLettered'",
        )
        if found:
            break
        await asyncio.sleep(0.2)
    assert found == [["kf-doomed", "2", cause.event_id, cause.campaign_id]]


def _server(home: Path, url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "server", "--home", str(home), "--nats", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _position(nc: Client) -> int:
    try:
        return (await status(nc, timeout=1)).last_position
    except StoreUnavailable:
        return -1


@pytest.mark.asyncio
async def test_a_recorder_killed_mid_batch_resumes_exactly_once(
    tmp_path: Path, nats_server: EmbeddedNatsServer
) -> None:
    total = 40_000
    nc = await connect(nats_server.url, "test")
    js = jetstream(nc)
    await ensure_events_stream(js)
    events = [started(f"c{i % 4}") if i % 3 else calibrated(f"c{i % 4}") for i in range(total)]
    await Emitter(js).emit_many(events)
    home = tmp_path / "home"

    recorder = _server(home, nats_server.url)
    killed_at = -1
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        killed_at = await _position(nc)
        if killed_at > 0:
            break
        await asyncio.sleep(0.005)
    recorder.send_signal(signal.SIGKILL)
    recorder.wait()
    assert 0 < killed_at < total, f"kill landed at {killed_at} of {total}"

    recorder = _server(home, nats_server.url)
    deadline = time.monotonic() + 120
    while await _position(nc) < total and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    recorder.send_signal(signal.SIGTERM)
    assert recorder.wait(30) == 0
    await nc.close()

    store = DuckDBEventStore(home / "events.duckdb", read_only=True)
    try:
        counts = store.query(
            "SELECT count(*), count(DISTINCT event_id), min(position), max(position), "
            "count(DISTINCT stream_seq) FROM events"
        ).rows
        assert counts == [[total, total, 1, total, total]]
        stored_ids = {event.event_id for _, event in store.replay()}
        assert stored_ids == {e.event_id for e in events}
        report = store.verify_chain()
        assert report.ok and report.events_checked == total and report.campaigns == 4
    finally:
        store.close()
    assert not (home / "server.json").exists() or os.environ.get("KEEP")
