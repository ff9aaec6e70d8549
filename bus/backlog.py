"""Work waiting in a durable consumer: not yet delivered, and delivered but not yet acked.

Read from the consumer's info: queued (`num_pending`), in flight (`num_ack_pending`) and
the instances asking for work now (`num_waiting`, the idle ones). `kfactory ps` shows it
per role consumer beside the heartbeats.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.client import Client
from nats.js.errors import NotFoundError

from bus.connection import jetstream
from bus.subjects import STREAM


@dataclass(frozen=True)
class Backlog:
    consumer: str
    queued: int
    """Messages not yet delivered to any instance."""
    in_flight: int
    """Delivered, not yet acked (being handled, or waiting to be redelivered)."""
    waiting_instances: int
    """Instances asking for work right now (idle)."""


async def backlog(nc: Client, consumer: str) -> Backlog | None:
    """The consumer's backlog, or None if it does not exist (no instance ever ran)."""
    try:
        info = await jetstream(nc).consumer_info(STREAM, consumer)
    except NotFoundError:
        return None
    return Backlog(
        consumer,
        queued=info.num_pending or 0,
        in_flight=info.num_ack_pending or 0,
        waiting_instances=info.num_waiting or 0,
    )
