"""The runtime every role shares: subscribe to event types, handle, emit, stop cleanly.

An actor declares its `role`, the event types it `reacts_to`, optionally a `target`
(then its consumer is the role's for that target), `max_deliver` (5), `give_up_after`
(60 s: a failing message is given up on only after both its deliveries and this long
since it was published, so another instance NAKing everything cannot run it out;
`bus/consumer.py`), `ack_wait` (10 s: a worker that died is noticed this late; a live
one reports progress every third of it) and `shutdown_grace`, and implements
`handle(event, out)`. The runtime binds the role's
durable consumer (instances of a role compete for the work), admits each message by the
recorder's rule (`eventstore/admission.py`; one the recorder refuses is acked and
dropped, since the recorder stores its `EventRejected`: a flood of junk costs no dead
letters; a type the recorder may refuse by what was recorded before it, a benchmark, is
handled only once the store holds it, and dropped if the recorder went past it without
storing it: `eventstore/causality.py`), calls `handle` inside
a structlog context (campaign, role, instance), publishes what it emitted with causation
and correlation ids, and only then acks. `out.emit(EventType, **payload)` builds a
reaction whose id derives from its cause under the role's key (`eventstore/ids.py`: the
key comes from the connection's seed, `bus.connection.id_key`), so a redelivered message
that is handled again yields the same events, which the bus and the store deduplicate,
and no other role can publish under that id first; `event_id=out.derived_id(...)`
overrides it for a fact that several causes may reach. `ActorStarted` and
`ActorStopped` are published under the campaign `kf-system`.

On SIGTERM or SIGINT it stops fetching; the in-flight message is finished within
`shutdown_grace` (0.5 s, so the process ends within 2 s) or `nak`ed for another
instance; nothing is acked that was not done.

While it runs, the runtime publishes the actor's heartbeat (`bus/heartbeat.py`): what it
serves, the event it is handling, and its state in words, which a handler sets with
`self.status(...)` from any thread (the benchmarker: `waiting for the lease on
cpu.<host>, held by benchmarker-2`, then `timing on cpu.<host> (lease 42)`; a verifier:
`waiting for benchmarker-2's timed window on cpu.<host>`).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import structlog

from bus.auth import ClientAuth
from bus.connection import Client, ConnectStopped, Msg, connect, id_key, jetstream
from bus.consumer import Discard, PoisonMessage, WorkConsumer
from bus.heartbeat import Heartbeat, beat_until
from bus.publisher import msg_id
from bus.streams import wait_for_stream
from bus.subjects import check_token, type_filters
from eventstore.admission import admit
from eventstore.causality import CHECKED_TYPES
from eventstore.codec import InvalidEvent
from eventstore.emitter import Emitter
from eventstore.events import (
    SYSTEM_CAMPAIGN,
    ActorRef,
    ActorStarted,
    ActorStopped,
    Event,
    new_event,
)
from eventstore.failures import dead_letter_event
from eventstore.ids import derived_event_id
from eventstore.queries import stored_or_refused

log = structlog.get_logger("actors.runtime")

#: Seconds an actor waits for the recorder to take a message it may refuse by what was
#: recorded before it (`eventstore.causality.CHECKED_TYPES`); then it is retried later.
RECORDED_WAIT = 30.0

E = TypeVar("E", bound=Event)


class Reactions:
    """What a handler emits in response to one event; ids derive from that event, under
    the role's `key`."""

    def __init__(self, cause: Event, actor: ActorRef, key: bytes = b"") -> None:
        self.cause = cause
        self.actor = actor
        self.key = key
        self.events: list[Event] = []

    def derived_id(self, cause_id: str, *parts: str | int) -> str:
        """An id derived from `cause_id` and `parts` under this role's key."""
        return derived_event_id(cause_id, *parts, key=self.key)

    def emit(
        self,
        cls: type[E],
        *,
        campaign_id: str | None = None,
        event_id: str | None = None,
        **payload: Any,
    ) -> E:
        """Record a reaction; `event_id` overrides the cause-derived id (for facts that
        several causes may reach, such as closing a generation)."""
        event = new_event(
            cls,
            campaign_id=campaign_id or self.cause.campaign_id,
            actor=self.actor,
            cause=self.cause,
            event_id=event_id
            or self.derived_id(self.cause.event_id, self.actor.role, len(self.events)),
            **payload,
        )
        self.events.append(event)
        return event


class Actor(abc.ABC):
    """One role. Subclasses set `role` and `reacts_to` and implement `handle`."""

    role: ClassVar[str]
    reacts_to: ClassVar[tuple[type[Event], ...]]
    #: Consumers are per role, and per target when the role only serves one device.
    target: str | None = None
    max_deliver: int = 5
    #: Seconds since a message was published before a failing one is given up on.
    give_up_after: float = 60.0
    #: Short, because long handlers report progress every third of it: a worker that
    #: died is noticed (and its message redelivered) within this many seconds.
    ack_wait: float = 10.0
    #: On SIGTERM, in-flight work gets this long to finish before it is left for
    #: redelivery (short: every command stops within 2 s of a signal).
    shutdown_grace: float = 0.5
    #: The device this instance runs kernels on, for its heartbeat ("" if none).
    device: str = ""
    _report: Callable[[str], None] | None = None

    def status(self, state: str) -> None:
        """Say what this instance is doing now, in words (safe from any thread)."""
        if self._report is not None:
            self._report(state)

    @abc.abstractmethod
    async def handle(self, event: Event, out: Reactions) -> None:
        """React to one event by calling `out.emit(...)`; raise to have it retried."""

    async def setup(self, nc: Client, ref: ActorRef) -> None:  # noqa: B027 - optional hook
        """Before the first message: open services, load caches."""

    async def teardown(self) -> None:  # noqa: B027 - optional hook
        """After the last message."""

    @property
    def durable_name(self) -> str:
        return durable_name(self.role, self.target)


def durable_name(role: str, target: str | None) -> str:
    """The durable consumer a role's instances share (per target when it serves one)."""
    name = f"kf-{role}" + (f"-{target}" if target else "")
    return check_token(name.replace(":", "-"), "consumer name")


class ActorRuntime:
    def __init__(self, actor: Actor, nc: Client, instance: str | None = None) -> None:
        self.actor = actor
        self.ref = ActorRef.here(actor.role, instance)
        self.nc = nc
        self._id_key = id_key(nc)
        self._js = jetstream(nc)
        self._emitter = Emitter(self._js)
        self.handled = 0
        self.job = ""
        self.state = "starting"
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def heartbeat(self) -> Heartbeat:
        with self._lock:
            job, state = self.job, self.state
        return Heartbeat(
            role=self.ref.role,
            instance=self.ref.instance,
            host=self.ref.host,
            pid=os.getpid(),
            target=self.actor.target or "",
            device=self.actor.device,
            job=job,
            state=state,
            handled=self.handled,
            sent=time.time(),
        )

    def _set_state(self, state: str, job: str | None = None) -> None:
        with self._lock:
            self.state = state
            if job is not None:
                self.job = job
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._changed.set)

    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self.actor._report = self._set_state
        beating = asyncio.create_task(beat_until(self.nc, self.heartbeat, self._changed, stop))
        try:
            await self._run(stop)
        finally:
            beating.cancel()
            with contextlib.suppress(BaseException):
                await beating

    async def _run(self, stop: asyncio.Event) -> None:
        await wait_for_stream(self._js)
        types = [cls.__name__ for cls in self.actor.reacts_to]
        consumer = WorkConsumer(
            self._js,
            self.actor.durable_name,
            type_filters(types, self.actor.target),
            self._on_message,
            self._dead_letter,
            max_deliver=self.actor.max_deliver,
            min_age=self.actor.give_up_after,
            ack_wait=self.actor.ack_wait,
            grace=self.actor.shutdown_grace,
        )
        await self._emitter.emit(
            new_event(
                ActorStarted,
                campaign_id=SYSTEM_CAMPAIGN,
                actor=self.ref,
                reacts_to=types,
                pid=os.getpid(),
            )
        )
        with structlog.contextvars.bound_contextvars(
            role=self.ref.role, instance=self.ref.instance
        ):
            await self.actor.setup(self.nc, self.ref)
            log.info("actor started", reacts_to=types, consumer=consumer.durable)
            self._set_state("idle")
            try:
                await consumer.run(stop)
            finally:
                await self.actor.teardown()
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1):
                        await self._emitter.emit(
                            new_event(ActorStopped, campaign_id=SYSTEM_CAMPAIGN, actor=self.ref)
                        )
                log.info("actor stopped", handled=self.handled)

    async def _on_message(self, message: Msg) -> None:
        try:
            event = admit(message.subject, message.data, msg_id(message)).event
        except InvalidEvent as exc:  # the recorder refuses it too, with an EventRejected
            raise Discard(f"not an event the recorder accepts: {exc}") from exc
        if event.type in CHECKED_TYPES:
            await self._stored_first(event, message)
        out = Reactions(event, self.ref, self._id_key)
        self._set_state("working", _job(event))
        try:
            with structlog.contextvars.bound_contextvars(campaign=event.campaign_id):
                await self.actor.handle(event, out)
                if out.events:
                    await self._emitter.emit_many(out.events)
            self.handled += 1
        finally:
            self._set_state("idle", "")

    async def _stored_first(self, event: Event, message: Msg) -> None:
        """Wait until the recorder stored `event`; Discard it if the recorder refused it
        (a rule of what was recorded before it, which admission alone cannot check)."""
        sequence = message.metadata.sequence.stream
        if not await stored_or_refused(self.nc, event.event_id, sequence, RECORDED_WAIT):
            raise Discard(f"the recorder refused {event.type} {event.event_id}")

    async def _dead_letter(self, message: Msg, reason: str) -> None:
        metadata = message.metadata
        await self._emitter.emit(
            dead_letter_event(
                self.ref,
                metadata.consumer,
                message.subject,
                message.data,
                metadata.sequence.stream,
                metadata.num_delivered,
                reason,
                key=self._id_key,
            )
        )


def _job(event: Event) -> str:
    candidate = getattr(event, "candidate_id", None)
    return f"{event.type} {candidate or event.campaign_id}"


async def run_actor(
    actor: Actor,
    nats_url: str,
    instance: str | None = None,
    stop: asyncio.Event | None = None,
    auth: ClientAuth | None = None,
) -> None:
    """Run one actor until `stop` is set (the `kfactory actor` process body); without
    `stop`, until SIGTERM or SIGINT. Waits for the hub as long as it takes."""
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    try:
        nc = await connect(nats_url, f"kf-{actor.role}", wait_for_server=None, stop=stop, auth=auth)
    except ConnectStopped:
        return
    try:
        await ActorRuntime(actor, nc, instance).run(stop)
    finally:
        await nc.close()  # what it published was acked already: nothing to drain


__all__ = ["Actor", "ActorRuntime", "PoisonMessage", "Reactions", "run_actor"]
