"""The store service's fair pool: a share per asker, turns across askers."""

from __future__ import annotations

import asyncio
import threading

import pytest

from eventstore.fair_pool import FairPool


@pytest.mark.asyncio
async def test_one_asker_holds_at_most_its_share_and_others_take_turns() -> None:
    pool = FairPool(workers=3, per_principal=2, name="test-fair")
    release = threading.Event()
    started: list[str] = []
    lock = threading.Lock()

    def work(name: str) -> str:
        with lock:
            started.append(name)
        release.wait(30)
        return name

    flood = [asyncio.create_task(pool.run("a", lambda i=i: work(f"a{i}"))) for i in range(6)]
    await asyncio.sleep(0.2)
    assert pool.running("a") == 2, "one asker took more than its share"
    other = asyncio.create_task(pool.run("b", lambda: work("b0")))
    await asyncio.sleep(0.2)
    assert started[-1] == "b0" and pool.running("b") == 1, started
    release.set()
    assert await other == "b0"
    assert sorted(await asyncio.gather(*flood)) == [f"a{i}" for i in range(6)]
    assert pool.running("a") == 0


@pytest.mark.asyncio
async def test_a_cancelled_wait_gives_its_turn_to_the_next() -> None:
    pool = FairPool(workers=1, per_principal=1, name="test-fair")
    release = threading.Event()
    first = asyncio.create_task(pool.run("a", lambda: release.wait(30)))
    await asyncio.sleep(0.1)
    waiting = asyncio.create_task(pool.run("b", lambda: "b"))
    after = asyncio.create_task(pool.run("c", lambda: "c"))
    await asyncio.sleep(0.1)
    waiting.cancel()
    release.set()
    assert await first is True
    assert await after == "c"
    with pytest.raises(asyncio.CancelledError):
        await waiting
