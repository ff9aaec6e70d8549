"""Keeping a `History` current by replaying the store through its owner.

`catch_up` applies every stored event of `HISTORY_TYPES` since the history's position,
fetched from the store's `kf.svc.kf-store.replay` endpoint. Before a role decides on an
event it catches up until that event is stored (`until_event_id`), polling for up to
`timeout` (60 s); then NotYetRecorded, a transient failure, sends the message back for a
later delivery. So decisions never miss their cause.

`off_loop` runs a long decision (the planner's search: seconds of optuna for a wide
generation) in a worker thread, with no event applied meanwhile: every actor of
`kfactory run` shares one event loop with the recorder, whose recording lease dies if
that loop stops for its TTL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from actors.campaign.history import HISTORY_TYPES, History
from bus.connection import Client
from eventstore.queries import replay

T = TypeVar("T")


class NotYetRecorded(TimeoutError):
    """The event being handled has not reached the store yet; retry later."""


class HistoryReader:
    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self.history = History()
        self._lock = asyncio.Lock()

    async def off_loop(self, decide: Callable[[History], T]) -> T:
        """`decide` on the history in a worker thread, with no event applied meanwhile: a
        long decision (a search) must not hold up the event loop its process shares with
        other actors and, in `kfactory run`, the recorder's lease."""
        async with self._lock:
            return await asyncio.to_thread(decide, self.history)

    async def catch_up(self, until_event_id: str | None = None, timeout: float = 60.0) -> History:
        """Apply every stored event since the last call; with `until_event_id`, wait until
        that event is among them, so a decision never misses the fact that caused it."""
        deadline = time.monotonic() + timeout
        async with self._lock:
            while True:
                for position, event in await replay(
                    self._nc, types=HISTORY_TYPES, after_position=self.history.position
                ):
                    self.history.apply(position, event)
                if until_event_id is None or until_event_id in self.history.event_ids:
                    return self.history
                if time.monotonic() > deadline:
                    raise NotYetRecorded(f"event {until_event_id} is not in the store yet")
                await asyncio.sleep(0.05)
