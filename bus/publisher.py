"""Publishing to JetStream that never loses a message to a server outage.

Every message carries `Nats-Msg-Id`, so a retry after a lost ack is deduplicated by
the server (within its duplicate window) and by the store (on the event id).

`publish` waits for JetStream's ack (`ack_timeout`, 5 s) and retries a transient failure
(a timeout, no responders, a connection closed or reconnecting, JetStream unavailable)
with the same id, backing off from 50 ms to 1 s, for `retry_for` s: None, the default,
is forever, so a server restart of any length delays a publisher and loses nothing.
`publish_many` pipelines with `publish_async` and re-sends what was not acked, one by
one, with the same ids.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import NamedTuple

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck

log = structlog.get_logger("bus.publisher")

MSG_ID_HEADER = "Nats-Msg-Id"


def msg_id(message: Msg) -> str | None:
    """The `Nats-Msg-Id` a received message was published with, if any."""
    return (message.headers or {}).get(MSG_ID_HEADER)


_RETRYABLE: tuple[type[BaseException], ...] = (
    asyncio.TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
)


_STALLED: tuple[type[BaseException], ...] = (*_RETRYABLE, nats.js.errors.TooManyStalledMsgsError)


class OutgoingMessage(NamedTuple):
    subject: str
    data: bytes
    msg_id: str


class PublishFailed(RuntimeError):
    """The server did not acknowledge a message before the retry deadline."""


class Publisher:
    """Publishes with acks, retrying with backoff for `retry_for` seconds (None: forever)."""

    def __init__(
        self,
        js: JetStreamContext,
        *,
        ack_timeout: float = 5.0,
        retry_for: float | None = None,
    ) -> None:
        self._js = js
        self._ack_timeout = ack_timeout
        self._retry_for = retry_for

    async def publish(self, subject: str, data: bytes, msg_id: str) -> PubAck:
        deadline = None if self._retry_for is None else time.monotonic() + self._retry_for
        delay = 0.05
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._js.publish(
                    subject, data, timeout=self._ack_timeout, headers={MSG_ID_HEADER: msg_id}
                )
            except _RETRYABLE as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise PublishFailed(
                        f"{subject}: no ack after {attempt} attempts: {exc!r}"
                    ) from exc
                if attempt in (3, 30) or attempt % 300 == 0:
                    log.warning("publish waiting for the server", subject=subject, attempt=attempt)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def publish_many(self, messages: Iterable[OutgoingMessage]) -> int:
        """Publish a batch with pipelined acks (`publish_async`); returns how many were acked.

        Messages whose ack does not come back in time are re-sent one by one with the
        same id, so the batch ends fully stored or raises.
        """
        pending: list[tuple[OutgoingMessage, asyncio.Future[PubAck] | None]] = []
        for message in messages:
            try:
                future = await self._js.publish_async(
                    message.subject,
                    message.data,
                    headers={MSG_ID_HEADER: message.msg_id},
                    wait_stall=self._ack_timeout,
                )
            except _STALLED:
                future = None
            pending.append((message, future))
        futures = [f for _, f in pending if f is not None]
        if futures:
            await asyncio.wait(futures, timeout=self._ack_timeout + 0.001 * len(futures))
        acked = 0
        for message, future in pending:
            if future is not None and future.done() and not future.cancelled():
                if future.exception() is None:
                    acked += 1
                    continue
            elif future is not None:
                future.cancel()
            await self.publish(*message)
            acked += 1
        return acked
