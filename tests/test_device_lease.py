"""Device leases against a real nats-server: one timed window at a time on a device,
shared work (verification, compilation) only between windows, and a dead holder's lease
expiring."""

from __future__ import annotations

import asyncio
import time

import pytest

from bus.connection import Client, connect, jetstream
from bus.device_lease import DeviceLeases, TimingWindows, device_key
from bus.lease import DEVICE_LEASES, LeaseLost, ensure_lease_bucket
from bus.server import EmbeddedNatsServer

DEVICE = device_key("cpu", "host-a.example.com")


async def _leases(nc: Client, holder: str, ttl: int = 10) -> DeviceLeases:
    await ensure_lease_bucket(jetstream(nc), DEVICE_LEASES)
    return await DeviceLeases.open(jetstream(nc), holder, ttl)


def test_device_keys_are_kv_safe_and_per_device() -> None:
    assert device_key("cpu", "host-a.example.com") == "cpu.host-a_example_com"
    assert device_key("cuda", "gpu-host", "1") == "cuda.gpu-host.1"
    assert device_key("cuda", "gpu-host", "0") != device_key("cuda", "gpu-host", "1")


@pytest.mark.asyncio
async def test_benchmarkers_time_one_at_a_time_and_say_whom_they_wait_for(nc: Client) -> None:
    inside: list[str] = []
    overlaps: list[list[str]] = []
    said: dict[str, list[str]] = {"b1": [], "b2": [], "b3": []}

    async def time_something(who: str) -> None:
        leases = await _leases(nc, who)
        for _ in range(3):
            async with leases.timing(DEVICE, said[who].append) as held:
                inside.append(who)
                if len(inside) > 1:
                    overlaps.append(list(inside))
                await asyncio.sleep(0.05)
                held.check()
                inside.remove(who)

    await asyncio.wait_for(asyncio.gather(*(time_something(w) for w in said)), 60)
    assert overlaps == []
    waited = [s for says in said.values() for s in says if s.startswith("waiting for the lease")]
    assert waited, said
    assert all(f"on {DEVICE}, held by b" in s for s in waited)
    assert all(s.startswith(f"timing on {DEVICE} (lease ") for s in said["b1"][-1:])


@pytest.mark.asyncio
async def test_shared_work_never_runs_in_a_timed_window(nc: Client) -> None:
    """Verifiers share the device between windows; a benchmarker waits for the running
    ones, and new ones wait for its window to end."""
    events: list[tuple[str, str]] = []
    timing_now = False
    violations: list[str] = []

    async def verify(who: str, rounds: int) -> None:
        leases = await _leases(nc, who)
        for _ in range(rounds):
            async with leases.shared(DEVICE):
                if timing_now:
                    violations.append(who)
                events.append((who, "start"))
                await asyncio.sleep(0.03)
                if timing_now:
                    violations.append(who)
                events.append((who, "end"))

    async def bench(who: str) -> None:
        nonlocal timing_now
        leases = await _leases(nc, who)
        for _ in range(3):
            async with leases.timing(DEVICE):
                timing_now = True
                events.append((who, "timing"))
                await asyncio.sleep(0.1)
                timing_now = False
            await asyncio.sleep(0.05)

    await asyncio.wait_for(asyncio.gather(verify("v1", 12), verify("v2", 12), bench("b1")), 60)
    assert violations == []
    assert sum(1 for _, what in events if what == "timing") == 3
    verifying_together = 0
    running: set[str] = set()
    for who, what in events:
        if what == "start":
            running.add(who)
            verifying_together = max(verifying_together, len(running))
        elif what == "end":
            running.discard(who)
    assert verifying_together == 2  # shared work is shared: verifiers overlap each other


@pytest.mark.asyncio
async def test_a_dead_benchmarker_s_lease_expires_and_the_next_one_times(
    nats_server: EmbeddedNatsServer,
) -> None:
    """A holder that stops renewing (its connection gone, as when its process dies) frees
    the device after the TTL; the next holder gets a larger fencing token."""
    dead = await connect(nats_server.url, "dead")
    alive = await connect(nats_server.url, "alive")
    try:
        first = await _leases(dead, "b-dead", ttl=2)
        held = await first.leases.try_acquire(f"{DEVICE}.timing", "b-dead")
        assert held is not None
        await dead.close()  # no release, no renewal: it died holding the device
        second = await _leases(alive, "b-alive", ttl=2)
        said: list[str] = []
        began = time.monotonic()
        async with second.timing(DEVICE, said.append) as window:
            waited = time.monotonic() - began
            assert window.token > held.token
        assert said[0] == f"waiting for the lease on {DEVICE}, held by b-dead"
        assert 0.5 < waited < 30
    finally:
        await alive.close()


@pytest.mark.asyncio
async def test_a_lease_taken_over_is_lost_to_its_old_holder(nc: Client) -> None:
    leases = await _leases(nc, "b1", ttl=2)
    other = await _leases(nc, "b2", ttl=2)
    async with leases.timing(DEVICE) as held:
        # it stalled past the TTL without renewing (a frozen process), and b2 took over
        await leases.leases.release(held.lease)
        taken = await other.leases.try_acquire(f"{DEVICE}.timing", "b2")
        assert taken is not None
        await asyncio.wait_for(held.lost.wait(), 10)
        with pytest.raises(LeaseLost):
            held.check()


@pytest.mark.asyncio
async def test_a_worker_thread_holds_the_device_only_for_its_timed_windows(nc: Client) -> None:
    """A timing run's thread opens a window, closes it when its timed rounds end, and a
    verifier that waited runs while the thread goes on (its re-check); a second window
    waits for no one and gets a later fencing token."""
    loop = asyncio.get_running_loop()
    windows = TimingWindows(await _leases(nc, "b1"), DEVICE, loop)
    verifier = await _leases(nc, "v1")
    log: list[str] = []

    async def verify() -> None:
        async with verifier.shared(DEVICE):
            log.append("verified")

    def timing_run() -> None:
        windows.open()
        log.append("timed rounds")
        verification = asyncio.run_coroutine_threadsafe(verify(), loop)
        time.sleep(0.5)
        log.append("window over")
        windows.close()
        verification.result(30)
        log.append("re-check")
        windows.open()
        log.append("timed again")
        windows.close()

    await asyncio.wait_for(asyncio.to_thread(timing_run), 60)
    assert log == ["timed rounds", "window over", "verified", "re-check", "timed again"]
    assert len(windows.tokens) == 2 and windows.tokens[1] > windows.tokens[0]
    windows.check()  # no window was lost
    assert await verifier.timing_holder(DEVICE) is None


@pytest.mark.asyncio
async def test_a_closed_window_keeps_a_share_so_no_other_window_opens_over_its_recheck(
    nc: Client,
) -> None:
    """After its timed rounds, a run's judging and re-check go on beside verification but
    never inside another benchmarker's window: the closed window keeps a share of the
    device (taken before the timing lease is given back) until `release`."""
    loop = asyncio.get_running_loop()
    first = TimingWindows(await _leases(nc, "b1"), DEVICE, loop)
    second = await _leases(nc, "b2")
    verifier = await _leases(nc, "v1")
    log: list[str] = []

    async def other_benchmarker() -> None:
        async with second.timing(DEVICE):
            log.append("b2 timing")

    async def verify() -> None:
        async with verifier.shared(DEVICE):
            log.append("verified")

    await first.enter()
    log.append("b1 timing")
    await first.exit()  # the timed rounds are over; the re-check begins
    assert await second.shared_holders(DEVICE) == ["b1"]
    await asyncio.wait_for(verify(), 30)  # verification may share the device meanwhile
    waiting = asyncio.create_task(other_benchmarker())
    await asyncio.sleep(0.5)
    assert not waiting.done()  # b2 waits for b1's re-check
    log.append("b1 re-check over")
    await first.release()
    await asyncio.wait_for(waiting, 30)
    assert log == ["b1 timing", "verified", "b1 re-check over", "b2 timing"]
    assert await second.shared_holders(DEVICE) == []


@pytest.mark.asyncio
async def test_a_window_runs_its_opened_hook_and_a_hook_that_raises_gives_the_run_up(
    nc: Client,
) -> None:
    """The hook runs once the device is held alone (here: the benchmarker's look at the
    history); when it raises, the raise reaches the thread that asked for the window,
    and the window is given back whole on `release`."""
    loop = asyncio.get_running_loop()
    seen: list[str | None] = []
    leases = await _leases(nc, "b1")

    async def opened() -> None:
        seen.append(await leases.timing_holder(DEVICE))
        raise RuntimeError("the best changed")

    windows = TimingWindows(leases, DEVICE, loop, opened=opened)
    with pytest.raises(RuntimeError, match="the best changed"):
        await asyncio.to_thread(windows.open)
    assert seen == ["b1"]
    await windows.release()
    assert await leases.timing_holder(DEVICE) is None
    assert await leases.shared_holders(DEVICE) == []
    other = await _leases(nc, "b2")
    assert await other.shared_holders(DEVICE) == []


@pytest.mark.asyncio
async def test_two_benchmarkers_with_repeated_runs_never_deadlock_or_overlap(
    nc: Client,
) -> None:
    """Two benchmarkers on one device, each job: a share for its build and set-up, a
    window, the re-check under the share it keeps, then a repeated run (a busy host) the
    same way. Neither ever waits for a window while holding a share (that would deadlock
    them), and no window overlaps the other's build, set-up or re-check."""
    loop = asyncio.get_running_loop()
    doing: dict[str, str] = {}
    overlaps: list[dict[str, str]] = []

    def phase(who: str, what: str | None) -> None:
        if what is None:
            doing.pop(who, None)
        else:
            doing[who] = what
        if "window" in doing.values() and len(doing) > 1:
            overlaps.append(dict(doing))

    def jobs(who: str, windows: TimingWindows) -> None:
        for _ in range(3):
            asyncio.run_coroutine_threadsafe(windows.share(), loop).result(60)
            for _run in range(2):
                phase(who, "set-up")
                time.sleep(0.05)
                phase(who, None)
                windows.open()
                phase(who, "window")
                time.sleep(0.05)
                phase(who, None)
                windows.close()
                phase(who, "re-check")
                time.sleep(0.1)
                phase(who, None)
            asyncio.run_coroutine_threadsafe(windows.release(), loop).result(60)

    both = [TimingWindows(await _leases(nc, who), DEVICE, loop) for who in ("b1", "b2")]
    await asyncio.wait_for(
        asyncio.gather(*(asyncio.to_thread(jobs, f"b{i}", w) for i, w in enumerate(both))), 90
    )
    assert overlaps == []
    assert [len(w.tokens) for w in both] == [6, 6]
