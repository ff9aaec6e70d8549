"""Heartbeats: who is alive on the bus, and what each is doing right now.

Every actor process publishes a small beat on core NATS (not JetStream: it is not a
fact to keep) every `BEAT_EVERY` s, and at once when its state changes or when someone
asks (`kf.hb.ping`). The subject is `kf.hb.<role>.<instance>`, and each role's user may
publish only under its own role, so no process can speak for another role.

A beat (`Heartbeat`) says role, instance, host, pid, target, device, the event being
handled, the state in words (set by the handler: `actors/runtime.py`), how many events it
handled and when it was sent. A process not heard from for `LIVE_FOR` (3 beats, 15 s) is
not live. `collect` pings and listens 1.5 s: `kfactory ps` shows what it heard, with
each role consumer's backlog (`bus/backlog.py`); `watch` is how `kfactory run` sees
which roles its campaign lacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from bus.subjects import check_token

HEARTBEAT_PREFIX = "kf.hb"
PING = f"{HEARTBEAT_PREFIX}.ping"
BEAT_EVERY = 5.0
#: A process not heard from for this long is no longer counted as live.
LIVE_FOR = 3 * BEAT_EVERY


class Heartbeat(msgspec.Struct, frozen=True):
    role: str
    instance: str
    host: str
    pid: int
    target: str = ""
    device: str = ""
    job: str = ""
    """The event being handled now ("" when idle)."""
    state: str = "idle"
    """What it is doing, in words: idle, working, waiting for the host's benchmark lock."""
    handled: int = 0
    sent: float = 0.0
    """When it was sent (seconds since the epoch, the sender's clock)."""


def heartbeat_subject(role: str, instance: str) -> str:
    token = re.sub(r"[^A-Za-z0-9_:-]", "_", instance)[:128] or "_"
    return f"{HEARTBEAT_PREFIX}.{check_token(role, 'role')}.{token}"


def role_subjects(role: str) -> str:
    """The subjects a role's user may publish its beats on."""
    return f"{HEARTBEAT_PREFIX}.{check_token(role, 'role')}.*"


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Heartbeat).decode


async def beat_until(
    nc: Client, current: Callable[[], Heartbeat], changed: asyncio.Event, stop: asyncio.Event
) -> None:
    """Publish `current()` every BEAT_EVERY s, when `changed` is set or on a ping."""

    async def on_ping(_: Msg) -> None:
        changed.set()

    pings = await nc.subscribe(PING, cb=on_ping)
    try:
        while not stop.is_set():
            beat = current()
            with contextlib.suppress(Exception):  # disconnected: the next beat will do
                await nc.publish(heartbeat_subject(beat.role, beat.instance), _encode(beat))
            changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(BEAT_EVERY):
                    await changed.wait()
    finally:
        with contextlib.suppress(Exception):
            await pings.unsubscribe()


Seen = Callable[[Heartbeat, float], Awaitable[None]]


async def watch(nc: Client, seen: Seen, *, ping: bool = True) -> Callable[[], Awaitable[None]]:
    """Call `seen(beat, received_at)` for every heartbeat; returns the function that stops it."""

    async def on_beat(message: Msg) -> None:
        try:
            beat = _decode(message.data)
        except msgspec.DecodeError:
            return
        await seen(beat, time.time())

    subscription = await nc.subscribe(f"{HEARTBEAT_PREFIX}.*.*", cb=on_beat)
    if ping:
        await nc.publish(PING, b"")
        await nc.flush()

    async def stop() -> None:
        with contextlib.suppress(Exception):
            await subscription.unsubscribe()

    return stop


async def collect(
    nc: Client, wait: float = 1.5, quiet: float | None = None
) -> dict[tuple[str, str], tuple[Heartbeat, float]]:
    """Every live process's latest beat: asks them all, then listens `wait` s, or, with
    `quiet`, until no new process has answered for `quiet` s (each answers the ask at
    once), `wait` s at most."""
    found: dict[tuple[str, str], tuple[Heartbeat, float]] = {}
    loop = asyncio.get_running_loop()
    last_new = loop.time()

    async def seen(beat: Heartbeat, at: float) -> None:
        nonlocal last_new
        if (beat.role, beat.instance) not in found:
            last_new = loop.time()
        found[(beat.role, beat.instance)] = (beat, at)

    stop = await watch(nc, seen)
    deadline = loop.time() + wait
    try:
        while (now := loop.time()) < deadline:
            if quiet is not None and now - last_new >= quiet:
                break
            await asyncio.sleep(min(deadline - now, 0.05 if quiet is not None else wait))
    finally:
        await stop()
    return found
