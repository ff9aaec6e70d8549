"""The recorder: the one process that owns the DuckDB file.

It reads `kf.ev.>` through an ordered push consumer (the fast path), appends in
micro-batches and commits the stream cursor in the same transaction as the events, so
a recorder killed at any instant resumes exactly after its last commit: nothing lost,
nothing stored twice. Messages that are not valid events (see `admission.py`) are
answered with an EventRejected event, whatever they hold, and so is a benchmark that
cites nothing recorded before it (`causality.py`: its index is built from the store
once, then kept by each accepted event); messages a consumer gave up
on become DeadLettered events. Both are published back through the bus, so every record
arrives the same way.

A batch is up to `max_batch` (5,000) events, gathered for `linger` (20 ms); past
`high_water` (50,000) buffered messages the recorder stops taking more and the stream's
flow control holds the server back. It starts after the store's cursor; if the stream is
behind the store (it was recreated), it reads all of it again and the event-id dedupe
keeps the store exact. A failing append is retried with backoff, the batch held. The
server's max-deliveries advisory (`bus.consumer.watch_exhausted`: a consumer with a
server-side limit whose worker died on a message's last delivery; the roles' work
consumers have none, their instances decide) becomes a DeadLettered event. The records
the recorder derives are keyed by the hub's key (`eventstore/ids.py`).

With a `lease` (the hub's recording lease, bus/lease.py), it checks the lease before
each batch and each event it emits, and writes every batch under the lease's fencing
token: once deposed it raises LeaseLost or FencedOut and writes nothing more.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import structlog

from bus.connection import Client, Msg, id_key, jetstream
from bus.consumer import ExhaustedMessage, watch_exhausted
from bus.follow import follow
from bus.lease import HeldLease
from bus.publisher import msg_id
from bus.streams import wait_for_stream
from bus.subjects import ALL_EVENTS, STREAM
from eventstore.admission import admit
from eventstore.authority import RECORDER
from eventstore.causality import INDEXED_TYPES, Causality
from eventstore.codec import InvalidEvent
from eventstore.emitter import Emitter
from eventstore.events import ActorRef, Event
from eventstore.failures import dead_letter_event, rejection_event
from eventstore.store import EventStore, Fence, FencedOut, Recorded

log = structlog.get_logger("eventstore.recorder")


@dataclass
class RecorderStats:
    recorded: int = 0
    duplicates: int = 0
    rejected: int = 0
    reencoded: int = 0
    dead_lettered: int = 0
    batches: int = 0


class Recorder:
    def __init__(
        self,
        nc: Client,
        store: EventStore,
        *,
        max_batch: int = 5_000,
        linger: float = 0.02,
        high_water: int = 50_000,
        lease: HeldLease | None = None,
    ) -> None:
        self._nc = nc
        self._js = jetstream(nc)
        self._id_key = id_key(nc)
        self._store = store
        self._emitter = Emitter(self._js)
        self._max_batch = max_batch
        self._linger = linger
        self._high_water = high_water
        self._lease = lease
        self._buffer: list[Msg] = []
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.actor = ActorRef.here(RECORDER)
        self.stats = RecorderStats()
        self.committed = asyncio.Condition()
        self._causality = Causality.of(event for _, event in store.replay_types(INDEXED_TYPES))

    async def run(self, stop: asyncio.Event) -> None:
        """Record until `stop` is set, then commit what has arrived and return."""
        await wait_for_stream(self._js)
        start = await self._resume_sequence()
        subscription = await follow(
            self._nc,
            ALL_EVENTS,
            self._on_message,
            start_sequence=start,
            pending_msgs=4 * self._high_water,
            pending_bytes=1024 * 1024 * 1024,
        )
        await watch_exhausted(self._nc, self._js, self._on_exhausted)
        log.info("recording", from_sequence=start, position=self._store.last_position)
        try:
            while not stop.is_set() or self._buffer:
                if not self._buffer:
                    self._arrived.clear()
                    waiter = asyncio.create_task(self._arrived.wait())
                    stopping = asyncio.create_task(stop.wait())
                    await asyncio.wait({waiter, stopping}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    stopping.cancel()
                    continue
                if len(self._buffer) < self._max_batch:
                    await asyncio.sleep(self._linger)
                batch = self._buffer[: self._max_batch]
                del self._buffer[: self._max_batch]
                if len(self._buffer) < self._high_water:
                    self._room.set()
                await self._record(batch)
        finally:
            await subscription.stop()

    async def _resume_sequence(self) -> int:
        info = await self._js.stream_info(STREAM)
        cursor = self._store.stream_cursor
        if cursor > info.state.last_seq:
            log.warning(
                "the stream is behind the store (recreated?); re-reading all of it",
                store_cursor=cursor,
                stream_last_seq=info.state.last_seq,
            )
            return max(info.state.first_seq, 1)
        return max(cursor + 1, info.state.first_seq, 1)

    async def _on_message(self, message: Msg) -> None:
        self._buffer.append(message)
        self._arrived.set()
        if len(self._buffer) >= self._high_water:
            self._room.clear()
            await self._room.wait()  # back-pressure: flow control holds the server

    def _fence(self) -> Fence | None:
        """The fence of the next write; raises LeaseLost once the lease is lost."""
        if self._lease is None:
            return None
        self._lease.check()
        return Fence(self._lease.token, self._lease.bucket.scope)

    async def _record(self, batch: list[Msg]) -> None:
        self._fence()
        recorded: list[Recorded] = []
        rejections: list[Event] = []
        sequence = 0
        for message in batch:
            sequence = _stream_sequence(message)
            try:
                admitted = admit(message.subject, message.data, msg_id(message))
                self._causality.check(admitted.event)
            except InvalidEvent as exc:
                rejections.append(self._rejection(message, sequence, str(exc)))
                continue
            if admitted.payload != message.data:
                self.stats.reencoded += 1
            self._causality.note(admitted.event)
            recorded.append(Recorded(admitted.event, admitted.payload, sequence))
        if rejections:  # stored when they come back through the bus, like every event
            await self._emitter.emit_many(rejections)
        cursor = sequence
        delay = 0.1
        while True:
            fence = self._fence()
            try:
                result = await asyncio.to_thread(self._store.append, recorded, cursor, fence)
                break
            except FencedOut:
                raise
            except Exception as exc:  # the store is unwell: hold the batch and retry
                log.error("append failed; retrying", error=str(exc), events=len(recorded))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        self.stats.recorded += result.appended
        self.stats.duplicates += result.duplicates
        self.stats.batches += 1
        async with self.committed:
            self.committed.notify_all()

    def _rejection(self, message: Msg, sequence: int, reason: str) -> Event:
        log.warning("rejected a message", subject=message.subject, seq=sequence, reason=reason)
        self.stats.rejected += 1
        try:
            published_ms = int(message.metadata.timestamp.timestamp() * 1000)
        except Exception:  # the server's metadata is not the sender's, but stay safe
            published_ms = 0
        return rejection_event(
            self.actor,
            message.subject,
            message.data,
            sequence,
            published_ms,
            reason,
            key=self._id_key,
        )

    async def _on_exhausted(self, exhausted: ExhaustedMessage) -> None:
        self._fence()
        reason = (
            f"{exhausted.deliveries} deliveries without an ack or a verdict "
            "(the handler crashed, hung or its process died)"
        )
        await self._emitter.emit(
            dead_letter_event(
                self.actor,
                exhausted.consumer,
                exhausted.subject,
                exhausted.data,
                exhausted.stream_seq,
                exhausted.deliveries,
                reason,
                key=self._id_key,
            )
        )
        self.stats.dead_lettered += 1


def _stream_sequence(message: Msg) -> int:
    tokens = (message.reply or "").split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<...>: fast path
        return int(tokens[5])
    return message.metadata.sequence.stream
