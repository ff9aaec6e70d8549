"""Competing work consumers: explicit acks, `in_progress()` while busy, bounded deliveries.

A failure is transient or permanent. Transient causes (the bus or a service away, a
role restarting, the store not yet holding the event being handled: timeouts,
connection errors, 5xx answers) are retried with backoff for `transient_window`
seconds (minutes); any other error is retried until both `max_deliver` deliveries and
`min_age` seconds (60) since the message was published have passed, and a
`PoisonMessage` not at all; a `Discard` is terminated with no dead letter. A message
given up on goes to the dead-letter callback with the reason and is then terminated.
Either way nothing is dropped silently.

Deliveries alone cannot decide: any instance of a role can NAK at once (an explicit NAK
ignores every backoff), so a rogue instance NAKing everything would run a message out of
deliveries in a moment. So the server's own `max_deliver` is unlimited and the honest
instances decide, each give-up needing its deliveries and its age (`_gives_up`): a
rogue's NAKs add deliveries, never time. A message whose handler keeps killing its
process never fails in a handler, so each instance checks before handling: one
delivered more often than any honest retry would (the transient count) and older than
the transient window is given up without being handled again ("crashed, hung, or NAK'd
by another instance"). (`watch_exhausted` still reports a consumer of the stream with a
server-side limit that ran a message out of it.)

A message is acked only after its handler returned (the actor runtime's handler returns
once JetStream acked the events it emitted). While it runs, `in_progress()` is sent every
third of `ack_wait`, so only a dead worker's message is redelivered. A failure is `nak`ed
with a delay from `retry_backoff` (0.5 s) doubling to `max_backoff` (15 s). Transient
(`is_transient`): a timeout, a connection error, nobody serving a request, a service
answer of code 500 or more, a lost lease; retried for `transient_window` (600 s), so a
role restarting costs no work. Any other error is given up on after `max_deliver` (5)
deliveries and `min_age`. The transient count is `deliveries_for(transient_window)`.
A role's work consumer is the admin's and its actors' alone (no other user may delete it,
`ops/accounts.py`); should it vanish anyway, an idle instance notices within
`CHECK_EVERY` (5 s) and creates it again. On a stop, the handler gets `grace` s, then
it is cancelled and its message `nak`ed for another instance. The dead-letter event's
id derives from the consumer and the candidate (`eventstore/failures.py`), so a
failure is reported once, whoever reports it: the consumer, or the recorder that watches
the advisory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig

from bus.lease import LeaseLost
from bus.service import ServiceError
from bus.streams import ensure_consumer, work_consumer_config
from bus.subjects import STREAM

log = structlog.get_logger("bus.consumer")

#: Seconds between checks, while idle, that the work consumer still exists.
CHECK_EVERY = 5.0
#: The server's `max_deliver` of a work consumer: no limit (the instances decide).
UNLIMITED = -1

Handler = Callable[[Msg], Awaitable[None]]
DeadLetter = Callable[[Msg, str], Awaitable[None]]
ExhaustedCallback = Callable[["ExhaustedMessage"], Awaitable[None]]

_TRANSIENT: tuple[type[BaseException], ...] = (
    asyncio.TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.NoRespondersError,
    nats.js.errors.ServiceUnavailableError,
)


class PoisonMessage(Exception):
    """Raised by a handler for a message no retry can fix: it is dead-lettered at once."""


class Discard(Exception):
    """Raised by a handler for a message that is not its business (someone else already
    records it as refused): it is acked and dropped, with a log line, no dead letter."""


def is_transient(error: BaseException) -> bool:
    """A failure that waiting can cure: something on the bus is away or behind."""
    if isinstance(error, ServiceError):
        return error.code >= 500
    # A lease lost mid-job (it expired, another took it): the job is redone under a new one.
    return isinstance(error, (TimeoutError, ConnectionError, LeaseLost, *_TRANSIENT))


def deliveries_for(window: float, backoff: float, max_backoff: float) -> int:
    """How many deliveries retrying with capped exponential backoff takes to span `window`."""
    deliveries, waited = 1, 0.0
    while waited < window:
        waited += min(backoff * 2 ** (deliveries - 1), max_backoff)
        deliveries += 1
    return deliveries


@dataclass(frozen=True)
class ExhaustedMessage:
    """A message the server stopped redelivering because it ran out of deliveries."""

    consumer: str
    stream_seq: int
    deliveries: int
    subject: str
    data: bytes


class WorkConsumer:
    """One instance of a role's durable pull consumer; instances share the work."""

    def __init__(
        self,
        js: JetStreamContext,
        durable: str,
        filter_subjects: list[str],
        handler: Handler,
        dead_letter: DeadLetter,
        *,
        max_deliver: int = 5,
        ack_wait: float = 30.0,
        grace: float = 10.0,
        retry_backoff: float = 0.5,
        max_backoff: float = 15.0,
        transient_window: float = 600.0,
        min_age: float = 60.0,
    ) -> None:
        self.durable = durable
        self._transient_deliveries = max(
            max_deliver, deliveries_for(transient_window, retry_backoff, max_backoff)
        )
        self._transient_age = max(transient_window, min_age)
        self._min_age = min_age
        self.config: ConsumerConfig = work_consumer_config(
            durable, filter_subjects, max_deliver=UNLIMITED, ack_wait=ack_wait
        )
        self._js = js
        self._handler = handler
        self._dead_letter = dead_letter
        self._max_deliver = max_deliver
        self._ack_wait = ack_wait
        self._grace = grace
        self._retry_backoff = retry_backoff
        self._max_backoff = max_backoff

    async def run(self, stop: asyncio.Event) -> None:
        """Handle messages one at a time until `stop` is set. A consumer that disappears
        (deleted behind the role's back) is created again within `CHECK_EVERY` s."""
        subscription = await self._bind()
        checked = time.monotonic()
        try:
            while not stop.is_set():
                try:
                    messages = await subscription.fetch(1, timeout=1.0)
                except _TRANSIENT:
                    # idle, or the server is away: nats-py reconnects on its own
                    if time.monotonic() - checked < CHECK_EVERY:
                        continue
                    checked = time.monotonic()
                    if await self._exists():
                        continue
                    messages = []
                except nats.js.errors.Error as exc:  # e.g. 409 consumer deleted
                    log.warning("fetch failed", consumer=self.durable, error=str(exc))
                    await asyncio.sleep(0.5)
                    messages = []
                    if await self._exists():
                        continue
                if not messages and not stop.is_set():
                    log.warning("work consumer gone; creating it again", consumer=self.durable)
                    with contextlib.suppress(Exception):
                        await subscription.unsubscribe()
                    subscription = await self._bind()
                    continue
                for message in messages:
                    await self._process(message, stop)
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def _bind(self) -> JetStreamContext.PullSubscription:
        await ensure_consumer(self._js, self.config)
        return await self._js.pull_subscribe_bind(durable=self.durable, stream=STREAM)

    async def _exists(self) -> bool:
        """False only when the server says the consumer is not there."""
        try:
            await self._js.consumer_info(STREAM, self.durable)
        except nats.js.errors.NotFoundError:
            return False
        except Exception:  # the server away: not the consumer's absence
            return True
        return True

    async def _process(self, message: Msg, stop: asyncio.Event) -> None:
        delivered = message.metadata.num_delivered
        if delivered > self._transient_deliveries and _age(message) >= self._transient_age:
            reason = (
                f"{delivered} deliveries over {_age(message):.0f} s without an outcome "
                "(its handler crashed, hung or its process died, or another instance NAKs it)"
            )
            await self._give_up(message, reason)
            return
        handling: asyncio.Task[None] = asyncio.ensure_future(self._handler(message))
        keep_alive = asyncio.create_task(self._keep_alive(message))
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({handling, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not handling.done():
                await asyncio.wait({handling}, timeout=self._grace)
            if not handling.done():
                handling.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await handling
                log.info("left for redelivery on shutdown", consumer=self.durable)
                with contextlib.suppress(Exception):
                    await message.nak()
                return
        finally:
            keep_alive.cancel()
            stopping.cancel()
        error = handling.exception()
        if error is None:
            await message.ack()
            return
        if isinstance(error, Discard):
            log.warning("dropped a message", consumer=self.durable, reason=str(error))
            await message.term()
            return
        await self._failed(message, error)

    async def _failed(self, message: Msg, error: BaseException) -> None:
        reason = f"{type(error).__name__}: {error}"
        delivered = message.metadata.num_delivered
        poison = isinstance(error, PoisonMessage)
        transient = is_transient(error)
        if not poison and not self._gives_up(delivered, _age(message), transient):
            log.warning(
                "handler failed; will retry",
                consumer=self.durable,
                reason=reason,
                transient=transient,
                delivery=delivered,
            )
            delay = min(self._retry_backoff * 2 ** (delivered - 1), self._max_backoff)
            await message.nak(delay=delay)
            return
        if not poison:
            reason = f"{reason} (gave up after {delivered} deliveries)"
        await self._give_up(message, reason)

    def _gives_up(self, delivered: int, age: float, transient: bool) -> bool:
        """Whether a failed message has had its deliveries and its time, both."""
        if transient:
            return delivered >= self._transient_deliveries and age >= self._transient_age
        return delivered >= self._max_deliver and age >= self._min_age

    async def _give_up(self, message: Msg, reason: str) -> None:
        try:
            await self._dead_letter(message, reason)
        except Exception as exc:  # left unacked: redelivered, and given up on again
            log.error("dead-letter publish failed", consumer=self.durable, error=str(exc))
            return
        await message.term()

    async def _keep_alive(self, message: Msg) -> None:
        while True:
            await asyncio.sleep(self._ack_wait / 3)
            with contextlib.suppress(*_TRANSIENT):
                await message.in_progress()


def _age(message: Msg) -> float:
    """Seconds since the message was published (the server's timestamp)."""
    return time.time() - message.metadata.timestamp.timestamp()


async def watch_exhausted(nc: Client, js: JetStreamContext, callback: ExhaustedCallback) -> None:
    """Report every message of KF_EVENTS that exhausted a consumer's deliveries."""

    async def on_advisory(advisory: Msg) -> None:
        try:
            body = json.loads(advisory.data)
            original = await js.get_msg(STREAM, int(body["stream_seq"]))
            await callback(
                ExhaustedMessage(
                    consumer=str(body["consumer"]),
                    stream_seq=int(body["stream_seq"]),
                    deliveries=int(body["deliveries"]),
                    subject=original.subject or "",
                    data=original.data or b"",
                )
            )
        except Exception as exc:
            log.error("could not report an exhausted message", error=str(exc))

    await nc.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{STREAM}.*", cb=on_advisory)
