"""Transient failures are retried for minutes, others given up on in seconds: a work
consumer against a real nats-server."""

from __future__ import annotations

import asyncio
import time

import pytest

from bus.connection import Client, Msg, jetstream
from bus.consumer import WorkConsumer, deliveries_for, is_transient
from bus.publisher import Publisher
from bus.service import NoAnswer, NoResponder, ServiceError
from bus.streams import ensure_events_stream
from bus.subjects import event_subject, type_filters


def test_what_counts_as_transient() -> None:
    assert is_transient(NoResponder("nobody serves kf-librarian.seen"))
    assert is_transient(NoAnswer("kf-librarian.kernel did not answer"))
    assert is_transient(ServiceError(503, "store behind"))
    assert not is_transient(ServiceError(400, "bad request"))
    assert not is_transient(ValueError("kernel exploded"))
    assert not is_transient(RuntimeError("template broke"))


def test_the_default_window_spans_minutes_of_deliveries() -> None:
    deliveries = deliveries_for(600.0, 0.5, 15.0)
    assert deliveries > 5
    waited = sum(min(0.5 * 2**n, 15.0) for n in range(deliveries - 1))
    assert 600 <= waited < 615


async def _consume(
    nc: Client, failure: BaseException, failures: int, **options: float
) -> tuple[list[int], list[str]]:
    js = jetstream(nc)
    await ensure_events_stream(js)
    await Publisher(js).publish(event_subject("c1", "Thing"), b"work", "m1")
    attempts: list[int] = []
    dead: list[str] = []
    finished = asyncio.Event()

    async def handler(msg: Msg) -> None:
        attempts.append(msg.metadata.num_delivered)
        if len(attempts) <= failures:
            raise failure
        finished.set()

    async def dead_letter(msg: Msg, reason: str) -> None:
        dead.append(reason)
        finished.set()

    consumer = WorkConsumer(
        js,
        "kf-test",
        type_filters(["Thing"]),
        handler,
        dead_letter,
        max_deliver=3,
        **{"min_age": 0.0, **options},
    )
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await asyncio.wait_for(finished.wait(), 30)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    return attempts, dead


@pytest.mark.asyncio
async def test_a_role_away_for_longer_than_max_deliver_is_waited_for(nc: Client) -> None:
    attempts, dead = await _consume(
        nc,
        NoResponder("nobody serves kf-librarian.kernel"),
        failures=8,
        retry_backoff=0.02,
        max_backoff=0.1,
        transient_window=5.0,
    )
    assert attempts == list(range(1, 10)) and dead == []


@pytest.mark.asyncio
async def test_a_cause_that_never_goes_away_is_dead_lettered_after_the_window(
    nc: Client,
) -> None:
    attempts, dead = await _consume(
        nc,
        NoAnswer("kf-librarian.seen did not answer"),
        failures=1000,
        retry_backoff=0.02,
        max_backoff=0.1,
        transient_window=0.5,
    )
    assert len(attempts) == deliveries_for(0.5, 0.02, 0.1) > 3
    assert dead == [
        f"NoAnswer: kf-librarian.seen did not answer (gave up after {len(attempts)} deliveries)"
    ]


@pytest.mark.asyncio
async def test_a_permanent_error_is_given_up_on_after_max_deliver(nc: Client) -> None:
    attempts, dead = await _consume(
        nc, ValueError("kernel exploded"), failures=1000, retry_backoff=0.02
    )
    assert attempts == [1, 2, 3]
    assert dead == ["ValueError: kernel exploded (gave up after 3 deliveries)"]


@pytest.mark.asyncio
async def test_a_permanent_error_is_given_up_on_only_once_the_message_is_old_enough(
    nc: Client,
) -> None:
    """Deliveries alone never give a message up (another instance's NAKs add them at
    will): it is retried past `max_deliver` until it is `min_age` old."""
    started = time.monotonic()
    attempts, dead = await _consume(
        nc, ValueError("kernel exploded"), failures=1000, retry_backoff=0.02, min_age=1.5
    )
    assert time.monotonic() - started >= 1.5
    assert len(attempts) > 3
    assert dead == [f"ValueError: kernel exploded (gave up after {len(attempts)} deliveries)"]
