"""Publishing events: each to `kf.ev.<campaign>.<type>[.<target>]`, with its id as Nats-Msg-Id.

Each event goes out in its canonical bytes (`codec.encode`), and `emit` returns once
JetStream has stored it, retrying for as long as it takes by default (`bus/publisher.py`).
"""

from __future__ import annotations

from collections.abc import Iterable

from bus.connection import JetStreamContext
from bus.publisher import OutgoingMessage, Publisher
from bus.subjects import event_subject
from eventstore.codec import encode
from eventstore.events import Event


def outgoing(event: Event) -> OutgoingMessage:
    return OutgoingMessage(
        event_subject(event.campaign_id, event.type, event.subject_target),
        encode(event),
        event.event_id,
    )


class Emitter:
    """Publishes events durably: returns once JetStream has stored them."""

    def __init__(self, js: JetStreamContext, retry_for: float | None = None) -> None:
        self._publisher = Publisher(js, retry_for=retry_for)

    async def emit(self, event: Event) -> None:
        await self._publisher.publish(*outgoing(event))

    async def emit_many(self, events: Iterable[Event]) -> int:
        return await self._publisher.publish_many(outgoing(e) for e in events)
