"""A bounded thread pool shared fairly by the principals that ask.

The store service runs each SQL query and replay page in a thread (DuckDB blocks). One
principal (a role's NATS user) asking for many slow queries at once must not make
another's `SELECT 1` wait: so no principal runs more than `per_principal` of the
`workers` threads at a time, and when a thread frees, the waiting work is started
round-robin across principals, each principal's own in the order it arrived. A
principal's work beyond its share waits in its own queue, never in the threads' queue.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class FairPool:
    def __init__(self, workers: int, per_principal: int, name: str) -> None:
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=name)
        self._free = workers
        self._per_principal = per_principal
        self._running: Counter[str] = Counter()
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    async def run(self, principal: str, work: Callable[[], T]) -> T:
        """`work()` in one of the pool's threads, when `principal`'s turn comes."""
        await self._enter(principal)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, work)
        finally:
            self._leave(principal)

    def running(self, principal: str) -> int:
        return self._running[principal]

    async def _enter(self, principal: str) -> None:
        if (
            self._free > 0
            and self._running[principal] < self._per_principal
            and principal not in self._waiting
        ):
            self._take(principal)
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(principal, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # given its turn, then cancelled
                self._leave(principal)
            else:
                self._forget(principal, turn)
            raise

    def _take(self, principal: str) -> None:
        self._free -= 1
        self._running[principal] += 1

    def _leave(self, principal: str) -> None:
        self._free += 1
        self._running[principal] -= 1
        if self._running[principal] <= 0:
            del self._running[principal]
        self._start_waiting()

    def _forget(self, principal: str, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(principal)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self._waiting[principal]

    def _start_waiting(self) -> None:
        """Give free threads to waiting work: the principals in turn, oldest first."""
        while self._free > 0:
            ready = next((p for p in self._waiting if self._running[p] < self._per_principal), None)
            if ready is None:
                return
            queue = self._waiting.pop(ready)
            turn = queue.popleft()
            if queue:  # its next waits behind every other principal's
                self._waiting[ready] = queue
            if turn.done():  # cancelled while waiting
                continue
            self._take(ready)
            turn.set_result(None)
