"""Leases in a NATS KV bucket, against a real nats-server: one holder at a time, expiry on
the server, fencing tokens that only grow, and a lost signal for a deposed holder."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from nats.js.errors import NotFoundError

from bus.connection import Client, connect, jetstream
from bus.lease import (
    DEVICE_LEASES,
    RECORDER_LEASES,
    AcquireStopped,
    Lease,
    LeaseBucket,
    LeaseError,
    LeaseLost,
    ensure_lease_bucket,
    kv_stream,
)
from bus.server import EmbeddedNatsServer
from ops.hub import Hub, running_hub

BUCKET = "TEST_LEASES"
#: Short, yet long enough for a renewal to get through on a loaded machine.
TTL = 2


@pytest_asyncio.fixture
async def leases(nc: Client) -> LeaseBucket:
    await ensure_lease_bucket(jetstream(nc), BUCKET)
    return await LeaseBucket.open(jetstream(nc), BUCKET, ttl=TTL)


@pytest_asyncio.fixture
async def other(nats_server: EmbeddedNatsServer) -> AsyncIterator[LeaseBucket]:
    """The same bucket seen through a second connection (another process, another host)."""
    client = await connect(nats_server.url, "other")
    try:
        yield await LeaseBucket.open(jetstream(client), BUCKET, ttl=TTL)
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_one_holder_at_a_time_and_tokens_only_grow(
    leases: LeaseBucket, other: LeaseBucket
) -> None:
    first = await leases.try_acquire("gpu0", "host-a")
    assert first is not None and first.token == first.revision
    assert await other.try_acquire("gpu0", "host-b") is None
    assert await leases.try_acquire("gpu0", "host-a") is None  # an earlier incarnation holds it
    seen = await other.current("gpu0")
    assert seen is not None and (seen.holder, seen.token) == ("host-a", first.token)

    renewed = await leases.renew(first)
    assert renewed.token == first.token and renewed.revision > first.revision
    seen = await other.current("gpu0")
    assert seen is not None and seen.token == first.token  # the token survives renewals
    assert await leases.release(renewed)
    assert await other.current("gpu0") is None

    second = await other.try_acquire("gpu0", "host-b")
    assert second is not None and second.token > renewed.revision
    assert not await leases.release(renewed)  # no longer ours: nothing happens
    assert (await other.current("gpu0")) == second
    with pytest.raises(LeaseLost):
        await leases.renew(renewed)


@pytest.mark.asyncio
async def test_an_unrenewed_lease_expires_on_the_server(
    leases: LeaseBucket, other: LeaseBucket
) -> None:
    first = await leases.try_acquire("cpu", "host-a")
    assert first is not None
    second = await asyncio.wait_for(other.acquire("cpu", "host-b"), 10)
    taken_at = time.monotonic()
    assert second is not None and second.holder == "host-b" and second.token > first.token
    assert taken_at >= first.valid_until  # never before the end the holder counted on
    with pytest.raises(LeaseLost):
        await leases.renew(first)


@pytest.mark.asyncio
async def test_held_renews_in_the_background_and_releases_on_exit(
    leases: LeaseBucket, other: LeaseBucket
) -> None:
    async with leases.held("gpu1", "host-a") as held:
        for _ in range(6):  # 1.5 TTLs
            await asyncio.sleep(TTL / 4)
            assert await other.try_acquire("gpu1", "host-b") is None
            held.check()
        assert held.lease.revision > held.token
    assert not held.lost.is_set()
    taken = await other.try_acquire("gpu1", "host-b")
    assert taken is not None and taken.token > held.lease.revision


@pytest.mark.asyncio
async def test_a_block_that_ends_as_a_renewal_returns_releases_its_lease(
    leases: LeaseBucket, other: LeaseBucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewing task is cancelled at the instant a renewal completes. Under Python 3.11
    `asyncio.wait_for` swallowed that cancellation (CPython gh-86296): the task renewed the
    lease for ever and the block never ended. A campaign stalled so, its benchmarker
    holding the device's timing lease with nothing running."""
    renewed = asyncio.Event()
    renew = leases.renew

    async def renew_then_say_so(lease: Lease) -> Lease:
        fresh = await renew(lease)
        renewed.set()  # the block wakes before the renewal's caller does
        return fresh

    async def hold_until_renewed() -> None:
        async with leases.held("gpu2", "host-a"):
            await renewed.wait()

    monkeypatch.setattr(leases, "renew", renew_then_say_so)
    holding = asyncio.create_task(hold_until_renewed())
    await asyncio.wait({holding}, timeout=3 * TTL)  # one renewal comes after TTL / 3
    ended = holding.done()
    while not holding.done():  # stuck renewing: give up on it (it may ignore a cancel)
        holding.cancel()
        await asyncio.wait({holding}, timeout=0.1)
    assert ended
    taken = await other.try_acquire("gpu2", "host-b")
    assert taken is not None


@pytest.mark.asyncio
async def test_a_deposed_holder_sees_its_lease_lost(
    leases: LeaseBucket, other: LeaseBucket, nc: Client
) -> None:
    async with leases.held("gpu2", "host-a") as held:
        # An operator removes the key, and another host takes the device.
        await (await jetstream(nc).key_value(BUCKET)).delete("gpu2")
        taken = await other.try_acquire("gpu2", "host-b")
        assert taken is not None and taken.token > held.token
        await asyncio.wait_for(held.lost.wait(), 5)
        with pytest.raises(LeaseLost, match="lost"):
            held.check()
    # the deposed holder's exit does not release the new holder's lease
    assert await other.current("gpu2") == taken


@pytest.mark.asyncio
async def test_waiting_stops_when_asked(leases: LeaseBucket, other: LeaseBucket) -> None:
    assert await leases.try_acquire("gpu3", "host-a") is not None
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, stop.set)
    assert await other.acquire("gpu3", "host-b", stop=stop) is None
    with pytest.raises(AcquireStopped):
        async with other.held("gpu3", "host-b", stop=stop):
            raise AssertionError("acquired a lease it was told to stop waiting for")
    with pytest.raises(LeaseError, match="held by host-a"):
        async with other.held("gpu3", "host-b", wait=False):
            raise AssertionError("acquired a held lease")


@pytest.mark.asyncio
async def test_bad_ttls_keys_and_buckets_are_refused(leases: LeaseBucket, nc: Client) -> None:
    for ttl in (0, 0.5, 1.5):
        with pytest.raises(LeaseError, match="whole number"):
            await LeaseBucket.open(jetstream(nc), BUCKET, ttl=ttl)
    with pytest.raises(LeaseError, match="no lease bucket"):
        await LeaseBucket.open(jetstream(nc), "NO_SUCH_BUCKET", ttl=1)
    for key in ("", "a b", "a.*", ".a"):
        with pytest.raises(LeaseError, match="invalid lease key"):
            await leases.try_acquire(key, "host-a")


@pytest.mark.asyncio
async def test_only_the_users_given_a_bucket_may_use_it(tmp_path: Path) -> None:
    """The benchmarker, the verifier and the kernel writer hold device leases and the hub
    the recorder's; a planner neither."""
    async with running_hub(tmp_path / "home") as hub:  # credentials on
        await _check_bucket_permissions(hub)
        assert hub.server is not None
        refusals = (hub.server.store_dir / "nats-server.log").read_text()
        assert f"$JS.API.STREAM.INFO.KV_{DEVICE_LEASES}" in refusals
        assert f"$KV.{RECORDER_LEASES}.probe" in refusals


async def _check_bucket_permissions(hub: Hub) -> None:
    granted = {
        "benchmarker": DEVICE_LEASES,
        "verifier": DEVICE_LEASES,
        "kernel-writer": DEVICE_LEASES,  # the agent operator's tool runs share the device
        "hub": RECORDER_LEASES,
    }
    for user, bucket in granted.items():
        client = await connect(hub.url, user, auth=hub.auth(user))
        try:
            leases = await LeaseBucket.open(jetstream(client, timeout=2), bucket, ttl=1)
            sharing = user in ("verifier", "kernel-writer")
            key = f"cpu.probe.shared.{user}" if sharing else f"probe-{user}"
            lease = await leases.try_acquire(key, user)  # those two: a shared key only
            assert lease is not None and await leases.release(lease)
        finally:
            await client.close()
    for user, bucket in [("planner", DEVICE_LEASES), ("benchmarker", RECORDER_LEASES)]:
        client = await connect(hub.url, user, auth=hub.auth(user))
        try:
            with pytest.raises(TimeoutError):  # the server drops a refused request
                await LeaseBucket.open(jetstream(client, timeout=0.5), bucket, ttl=1)
            with pytest.raises(TimeoutError):
                await jetstream(client, timeout=0.5).publish(f"$KV.{bucket}.probe", b"{}")
        finally:
            await client.close()


@pytest.mark.asyncio
async def test_an_actor_started_before_the_hub_waits_for_the_bucket(nc: Client) -> None:
    opening = asyncio.ensure_future(LeaseBucket.open(jetstream(nc), BUCKET, ttl=TTL, wait=True))
    await asyncio.sleep(0.5)
    assert not opening.done()  # no bucket yet: it waits, where wait=False would refuse
    await ensure_lease_bucket(jetstream(nc), BUCKET)
    leases = await asyncio.wait_for(opening, 10)
    assert await leases.try_acquire("k", "host-a") is not None


@pytest.mark.asyncio
async def test_a_released_key_leaves_nothing_behind_once_its_ttl_passes(
    nc: Client, leases: LeaseBucket
) -> None:
    lease = await leases.try_acquire("gone", "host-a")
    assert lease is not None and await leases.release(lease)
    js = jetstream(nc)
    deadline = time.monotonic() + TTL + 10
    while True:
        try:
            await js.get_msg(kv_stream(BUCKET), subject=f"$KV.{BUCKET}.gone")
        except NotFoundError:
            break  # the release marker expired as well
        assert time.monotonic() < deadline, "the release marker never expired"
        await asyncio.sleep(0.2)
