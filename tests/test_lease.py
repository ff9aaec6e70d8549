"""Leases in a NATS KV bucket, against a real nats-server: one holder at a time, expiry on
the server, fencing tokens that only grow, and a lost signal for a deposed holder."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from bus.connection import Client, connect, jetstream
from bus.lease import (
    DEVICE_LEASES,
    RECORDER_LEASES,
    AcquireStopped,
    LeaseBucket,
    LeaseError,
    LeaseLost,
    ensure_lease_bucket,
)
from bus.server import EmbeddedNatsServer
from ops.hub import Hub, running_hub

BUCKET = "TEST_LEASES"


@pytest_asyncio.fixture
async def leases(nc: Client) -> LeaseBucket:
    await ensure_lease_bucket(jetstream(nc), BUCKET)
    return await LeaseBucket.open(jetstream(nc), BUCKET, ttl=1)


@pytest_asyncio.fixture
async def other(nats_server: EmbeddedNatsServer) -> AsyncIterator[LeaseBucket]:
    """The same bucket seen through a second connection (another process, another host)."""
    client = await connect(nats_server.url, "other")
    try:
        yield await LeaseBucket.open(jetstream(client), BUCKET, ttl=1)
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
    started = time.monotonic()
    second = await asyncio.wait_for(other.acquire("cpu", "host-b"), 10)
    waited = time.monotonic() - started
    assert second is not None and second.holder == "host-b" and second.token > first.token
    assert waited >= 0.9  # not before the TTL the holder counted on
    assert first.expired()
    with pytest.raises(LeaseLost):
        await leases.renew(first)


@pytest.mark.asyncio
async def test_held_renews_in_the_background_and_releases_on_exit(
    leases: LeaseBucket, other: LeaseBucket
) -> None:
    async with leases.held("gpu1", "host-a") as held:
        for _ in range(6):  # 3 TTLs
            await asyncio.sleep(0.5)
            assert await other.try_acquire("gpu1", "host-b") is None
            held.check()
        assert held.lease.revision > held.token
    assert not held.lost.is_set()
    taken = await other.try_acquire("gpu1", "host-b")
    assert taken is not None and taken.token > held.lease.revision


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
    """The benchmarker holds device leases and the hub the recorder's; a verifier neither."""
    async with running_hub(tmp_path / "home") as hub:  # credentials on
        await _check_bucket_permissions(hub)
        assert hub.server is not None
        refusals = (hub.server.store_dir / "nats-server.log").read_text()
        assert f"$JS.API.STREAM.INFO.KV_{DEVICE_LEASES}" in refusals
        assert f"$KV.{RECORDER_LEASES}.probe" in refusals


async def _check_bucket_permissions(hub: Hub) -> None:
    granted = {"benchmarker": DEVICE_LEASES, "hub": RECORDER_LEASES}
    for user, bucket in granted.items():
        client = await connect(hub.url, user, auth=hub.auth(user))
        try:
            leases = await LeaseBucket.open(jetstream(client, timeout=2), bucket, ttl=1)
            lease = await leases.try_acquire(f"probe-{user}", user)
            assert lease is not None and await leases.release(lease)
        finally:
            await client.close()
    for user, bucket in [("verifier", DEVICE_LEASES), ("benchmarker", RECORDER_LEASES)]:
        client = await connect(hub.url, user, auth=hub.auth(user))
        try:
            with pytest.raises(TimeoutError):  # the server drops a refused request
                await LeaseBucket.open(jetstream(client, timeout=1), bucket, ttl=1)
            with pytest.raises(TimeoutError):
                await jetstream(client, timeout=1).publish(f"$KV.{bucket}.probe", b"{}")
        finally:
            await client.close()
