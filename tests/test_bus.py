"""The bus against a real nats-server: server lifecycle, streams, publishing, consumers,
request/reply."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from bus.connection import Client, connect, jetstream
from bus.consumer import PoisonMessage, WorkConsumer, deliveries_for
from bus.heartbeat import Heartbeat, beat_until, collect
from bus.publisher import OutgoingMessage, Publisher
from bus.server import EmbeddedNatsServer, pid_alive
from bus.service import RequestRefused, ServiceError, request, serve
from bus.streams import DUPLICATE_WINDOW_S, ensure_consumer, ensure_events_stream
from bus.subjects import STREAM, SubjectError, event_subject, type_filters


def test_server_starts_on_a_random_port_and_stops_without_leftovers(tmp_path: Path) -> None:
    server = EmbeddedNatsServer(tmp_path / "nats")
    url = server.start()
    pid = server.pid
    assert url.startswith("nats://127.0.0.1:") and server.port > 0
    assert pid is not None and pid_alive(pid)
    server.stop()
    assert not pid_alive(pid)


def test_server_dies_with_a_parent_that_was_killed(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from ops.logging import configure_logging; configure_logging()\n"
        "from bus.server import EmbeddedNatsServer\n"
        f"s = EmbeddedNatsServer({str(tmp_path)!r})\n"
        "s.start(); print(s.pid, flush=True); time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    server_pid = int(parent.stdout.readline())
    assert pid_alive(server_pid)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while running(server_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(server_pid), "nats-server outlived its parent"


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for an absent reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_subjects_refuse_unsafe_tokens() -> None:
    assert event_subject("c-1", "KernelVerified", "cuda:sm_90") == (
        "kf.ev.c-1.KernelVerified.cuda:sm_90"
    )
    for bad in ["a.b", "a b", "*", ">", ""]:
        with pytest.raises(SubjectError):
            event_subject(bad, "T")
    assert type_filters(["A"]) == ["kf.ev.*.A", "kf.ev.*.A.>"]


@pytest.mark.asyncio
async def test_a_client_waits_for_a_server_that_starts_late(tmp_path: Path) -> None:
    server = EmbeddedNatsServer(tmp_path / "nats")
    server.start()
    url = server.url
    server.stop()
    connecting = asyncio.create_task(connect(url, "late", wait_for_server=20))
    await asyncio.sleep(1.0)
    assert not connecting.done()
    await asyncio.to_thread(server.start)
    client = await connecting
    assert client.is_connected
    await client.close()
    server.stop()


@pytest.mark.asyncio
async def test_stream_declaration_is_idempotent(nc: Client) -> None:
    js = jetstream(nc)
    first = await ensure_events_stream(js)
    second = await ensure_events_stream(js)
    assert first.config.name == second.config.name == STREAM
    assert second.config.duplicate_window is not None
    assert second.config.duplicate_window >= 120 and DUPLICATE_WINDOW_S >= 120


@pytest.mark.asyncio
async def test_a_message_published_twice_with_one_id_is_stored_once(nc: Client) -> None:
    js = jetstream(nc)
    await ensure_events_stream(js)
    publisher = Publisher(js)
    subject = event_subject("c1", "Thing")
    await publisher.publish(subject, b"one", "id-1")
    again = await publisher.publish(subject, b"one", "id-1")
    assert again.duplicate
    acked = await publisher.publish_many(
        [OutgoingMessage(subject, b"x", f"id-{i}") for i in range(1, 4)]
    )
    assert acked == 3
    info = await js.stream_info(STREAM)
    assert info.state.messages == 3


async def _run_consumer(consumer: WorkConsumer, until: asyncio.Event, timeout: float) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await asyncio.wait_for(until.wait(), timeout)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


@pytest.mark.asyncio
async def test_a_failing_message_is_retried_then_dead_lettered_with_its_reason(
    nc: Client,
) -> None:
    js = jetstream(nc)
    await ensure_events_stream(js)
    await Publisher(js).publish(event_subject("c1", "Thing"), b"payload", "m1")
    attempts: list[int] = []
    dead: list[tuple[bytes, str]] = []
    finished = asyncio.Event()

    async def handler(msg: Msg) -> None:
        attempts.append(msg.metadata.num_delivered)
        raise ValueError("kernel exploded")

    async def dead_letter(msg: Msg, reason: str) -> None:
        dead.append((msg.data, reason))
        finished.set()

    consumer = WorkConsumer(
        js,
        "kf-test",
        type_filters(["Thing"]),
        handler,
        dead_letter,
        max_deliver=3,
        ack_wait=5,
        retry_backoff=0.05,
        min_age=0.0,
    )
    await _run_consumer(consumer, finished, timeout=30)
    assert attempts == [1, 2, 3]
    assert dead == [(b"payload", "ValueError: kernel exploded (gave up after 3 deliveries)")]


@pytest.mark.asyncio
async def test_a_poison_message_is_dead_lettered_without_retries(nc: Client) -> None:
    js = jetstream(nc)
    await ensure_events_stream(js)
    await Publisher(js).publish(event_subject("c1", "Thing"), b"junk", "m1")
    attempts: list[int] = []
    dead: list[str] = []
    finished = asyncio.Event()

    async def handler(msg: Msg) -> None:
        attempts.append(msg.metadata.num_delivered)
        raise PoisonMessage("not an event")

    async def dead_letter(msg: Msg, reason: str) -> None:
        dead.append(reason)
        finished.set()

    consumer = WorkConsumer(
        js, "kf-test", type_filters(["Thing"]), handler, dead_letter, max_deliver=5
    )
    await _run_consumer(consumer, finished, timeout=20)
    assert attempts == [1] and dead == ["PoisonMessage: not an event"]


@pytest.mark.asyncio
async def test_a_long_handler_keeps_its_message_with_in_progress(nc: Client) -> None:
    js = jetstream(nc)
    await ensure_events_stream(js)
    await Publisher(js).publish(event_subject("c1", "Thing"), b"slow", "m1")
    calls: list[int] = []
    finished = asyncio.Event()

    async def handler(msg: Msg) -> None:
        calls.append(msg.metadata.num_delivered)
        await asyncio.sleep(3.5)  # 3.5x the ack wait
        finished.set()

    async def dead_letter(msg: Msg, reason: str) -> None:
        raise AssertionError(reason)

    consumer = WorkConsumer(
        js, "kf-test", type_filters(["Thing"]), handler, dead_letter, max_deliver=5, ack_wait=1
    )
    await _run_consumer(consumer, finished, timeout=20)
    await asyncio.sleep(1.5)
    info = await js.consumer_info(STREAM, "kf-test")
    assert calls == [1]
    assert info.num_ack_pending == 0 and info.num_redelivered == 0


@pytest.mark.asyncio
async def test_instances_of_a_role_share_the_work_without_overlap(nc: Client) -> None:
    js = jetstream(nc)
    await ensure_events_stream(js)
    total = 40
    await Publisher(js).publish_many(
        [OutgoingMessage(event_subject("c1", "Thing"), b"%d" % i, f"m{i}") for i in range(total)]
    )
    handled: dict[str, list[bytes]] = {"a": [], "b": []}
    finished = asyncio.Event()

    def handler_for(name: str):  # type: ignore[no-untyped-def]
        async def handler(msg: Msg) -> None:
            await asyncio.sleep(0.02)
            handled[name].append(msg.data)
            if sum(map(len, handled.values())) == total:
                finished.set()

        return handler

    async def dead_letter(msg: Msg, reason: str) -> None:
        raise AssertionError(reason)

    consumers = [
        WorkConsumer(js, "kf-test", type_filters(["Thing"]), handler_for(n), dead_letter)
        for n in handled
    ]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.run(stop)) for c in consumers]
    await asyncio.wait_for(finished.wait(), 30)
    stop.set()
    await asyncio.gather(*tasks)
    everything = handled["a"] + handled["b"]
    assert sorted(everything) == sorted(b"%d" % i for i in range(total))
    assert handled["a"] and handled["b"]


@pytest.mark.asyncio
async def test_request_reply_answers_refuses_and_reports_failures(nc: Client) -> None:
    async def echo(data: bytes) -> bytes:
        if data == b"bad":
            raise RequestRefused("bad input")
        if data == b"crash":
            raise RuntimeError("boom")
        return data.upper()

    service = await serve(nc, "kf-test", "1.0.0", {"echo": echo})
    try:
        assert await request(nc, "kf-test", "echo", b"hi") == b"HI"
        with pytest.raises(ServiceError) as refused:
            await request(nc, "kf-test", "echo", b"bad")
        assert refused.value.code == 400 and "bad input" in str(refused.value)
        with pytest.raises(ServiceError) as crashed:
            await request(nc, "kf-test", "echo", b"crash")
        assert crashed.value.code == 500 and "boom" in str(crashed.value)
    finally:
        await service.stop()


@pytest.mark.asyncio
async def test_ps_stops_listening_once_every_actor_has_answered(nc: Client) -> None:
    """Issue 35: `ps` took the whole listening window; with `quiet` it returns once no new
    process has answered the ask for that long, the answers it got included."""
    beat = Heartbeat(role="planner", instance="planner-9", host="h", pid=1)
    stop, changed = asyncio.Event(), asyncio.Event()
    beating = asyncio.create_task(beat_until(nc, lambda: beat, changed, stop))
    try:
        began = time.monotonic()
        found = await collect(nc, wait=60.0, quiet=0.5)
        assert ("planner", "planner-9") in found
        assert time.monotonic() - began < 60.0  # not the whole window
    finally:
        stop.set()
        changed.set()
        await beating


@pytest.mark.asyncio
async def test_a_message_whose_handler_keeps_dying_is_given_up_on_by_an_instance(
    nc: Client,
) -> None:
    """The crash loop: each delivery's handler dies with its process (here: a worker of the
    consumer that takes the message and never answers). The server's deliveries are
    unlimited, so an instance gives it up once it was delivered more often than any honest
    retry would, over the transient window, without handling it again."""
    js = jetstream(nc)
    await ensure_events_stream(js)
    await Publisher(js).publish(event_subject("c1", "Thing"), b"kills its worker", "m1")
    handled: list[int] = []
    dead: list[tuple[int, str]] = []
    finished = asyncio.Event()

    async def handler(msg: Msg) -> None:
        handled.append(msg.metadata.num_delivered)

    async def dead_letter(msg: Msg, reason: str) -> None:
        dead.append((msg.metadata.num_delivered, reason))
        finished.set()

    options = {"retry_backoff": 0.05, "max_backoff": 0.1, "transient_window": 0.3, "min_age": 0.0}
    consumer = WorkConsumer(
        js, "kf-test", type_filters(["Thing"]), handler, dead_letter, ack_wait=0.5, **options
    )
    await ensure_consumer(js, consumer.config)
    dying = await js.pull_subscribe_bind(durable="kf-test", stream=STREAM)
    crashes = deliveries_for(0.3, 0.05, 0.1) + 1
    for _ in range(crashes):
        (taken,) = await dying.fetch(1, timeout=5)
        assert taken.data == b"kills its worker"
        await asyncio.sleep(0.7)  # past ack_wait: redelivered, as after a crash
    await dying.unsubscribe()
    await _run_consumer(consumer, finished, timeout=20)
    assert handled == []
    ((deliveries, reason),) = dead
    assert deliveries == crashes + 1 and "without an outcome" in reason, reason
