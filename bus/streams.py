"""Idempotent declarations of the event stream and the durable consumers on it.

`KF_EVENTS` holds `kf.ev.>` in file storage with limits retention (30 days, oldest
discarded) and a `DUPLICATE_WINDOW_S` (5-minute) duplicate window on `Nats-Msg-Id`. It has
one replica on a single server and `CLUSTER_REPLICAS` (3) on a JetStream cluster, so one
node may be lost without losing an acknowledged event: `default_replicas` reads the
server's INFO, which names a cluster when there is one. The caller may name the count
instead. An existing stream is brought to the configuration (an unchanged one is left
alone). Only the hub's admin creates it; actors and the recorder `wait_for_stream`.

Work consumers are durable pull consumers with explicit acks, one per role (and per
target), whose instances compete for messages (`bus/consumer.py`).
"""

from __future__ import annotations

import asyncio
import time

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
)
from nats.js.errors import BadRequestError, NotFoundError

from bus.subjects import ALL_EVENTS, STREAM

DUPLICATE_WINDOW_S = 300.0
MAX_EVENT_BYTES = 8 * 1024 * 1024
#: Replicas of KF_EVENTS on a cluster: a quorum of 2 survives the loss of any one node.
CLUSTER_REPLICAS = 3


def events_stream_config(max_age_days: float = 30.0, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=STREAM,
        description="Kernel Factory events (the DuckDB store is the durable record)",
        subjects=[ALL_EVENTS],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=max_age_days * 86400,
        max_msg_size=MAX_EVENT_BYTES,
        duplicate_window=DUPLICATE_WINDOW_S,
        allow_direct=True,
        num_replicas=replicas,
    )


_KEPT = (
    "subjects",
    "max_age",
    "max_msg_size",
    "duplicate_window",
    "allow_direct",
    "storage",
    "num_replicas",
)


class StreamRefused(RuntimeError):
    """The server would not create the events stream as configured."""


def default_replicas(server_info: dict[str, object]) -> int:
    """The replica count for the server a client is connected to (its INFO): a server
    that is part of a cluster names it."""
    return CLUSTER_REPLICAS if server_info.get("cluster") else 1


async def ensure_events_stream(js: JetStreamContext, replicas: int | None = None) -> StreamInfo:
    """Create KF_EVENTS, or bring an existing one to the current configuration (an
    unchanged stream is left alone, so a user without stream rights may call this).

    `replicas` None: 1 on a single server, `CLUSTER_REPLICAS` on a cluster."""
    if replicas is None:
        replicas = default_replicas(js._nc._server_info)
    config = events_stream_config(replicas=replicas)
    try:
        info = await js.stream_info(STREAM)
        if all(getattr(info.config, f) == getattr(config, f) for f in _KEPT):
            return info
    except NotFoundError:
        try:
            return await js.add_stream(config)
        except BadRequestError as refused:
            try:  # created concurrently by another process?
                await js.stream_info(STREAM)
            except NotFoundError:
                raise StreamRefused(
                    f"JetStream refused to create {STREAM} with {replicas} replica(s): "
                    f"{refused.description}"
                    + (f" (a cluster needs {replicas} or more nodes)" if replicas > 1 else "")
                ) from refused
    return await js.update_stream(config)


async def wait_for_stream(js: JetStreamContext, timeout: float | None = None) -> StreamInfo:
    """Wait until KF_EVENTS exists (only an admin creates it: actors and the recorder wait)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return await js.stream_info(STREAM)
        except (NotFoundError, TimeoutError) as exc:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"stream {STREAM} does not exist (is the hub up?)") from exc
            await asyncio.sleep(0.25)


def work_consumer_config(
    durable: str,
    filter_subjects: list[str],
    *,
    max_deliver: int,
    ack_wait: float,
) -> ConsumerConfig:
    """A pull consumer whose instances compete for messages, one message each at a time."""
    return ConsumerConfig(
        durable_name=durable,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        filter_subjects=filter_subjects,
        max_deliver=max_deliver,
        ack_wait=ack_wait,
        max_ack_pending=10_000,
        max_waiting=512,
    )


async def ensure_consumer(js: JetStreamContext, config: ConsumerConfig) -> ConsumerInfo:
    """Create or update a durable consumer on KF_EVENTS (safe to call from every instance)."""
    return await js.add_consumer(STREAM, config)
