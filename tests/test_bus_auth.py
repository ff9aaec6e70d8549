"""The bus as a trust boundary: every client authenticates, each role only does its job."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from bus.auth import AuthError, ClientAuth, TlsFiles
from bus.connection import Client, connect, jetstream
from bus.subjects import STREAM, event_subject
from eventstore.authority import ACTOR_ROLES
from eventstore.codec import encode
from eventstore.emitter import Emitter
from eventstore.events import ActorRef, CampaignFinished, KernelWritten, new_event
from ops.accounts import USERS, creds_dir, export_seed, seed_path
from ops.hub import Hub, running_hub
from ops.selfsigned import make_tls
from tests.conftest import calibrated

BENCHMARKER = ActorRef(role="benchmarker", instance="benchmarker-1", host="h")


@pytest_asyncio.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Hub]:
    """The embedded default: credentials on, loopback."""
    async with running_hub(tmp_path / "home") as hub:
        yield hub


def _server_log(hub: Hub) -> str:
    assert hub.server is not None
    return (hub.server.store_dir / "nats-server.log").read_text()


async def _violations(hub: Hub, count: int) -> list[str]:
    """The server's log lines refusing an operation, once `count` of them are there."""
    for _ in range(100):
        lines = [line for line in _server_log(hub).splitlines() if "Violation" in line]
        if len(lines) >= count:
            return lines
        await asyncio.sleep(0.05)
    raise AssertionError(f"expected {count} refusals in the server log, found {lines}")


def test_every_user_has_a_private_seed_and_the_roles_match_the_actors(tmp_path: Path) -> None:
    from actors.roles.registry import ROLES

    assert set(ACTOR_ROLES) == set(ROLES)
    assert set(USERS) == {*ROLES, "hub", "cli", "admin"}


@pytest.mark.asyncio
async def test_credentials_are_created_private_on_first_start(secured: Hub) -> None:
    folder = creds_dir(secured.home)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for user in USERS:
        assert stat.S_IMODE(seed_path(secured.home, user).stat().st_mode) == 0o600
    out = secured.home.parent / "elsewhere" / "verifier.nk"
    export_seed(secured.home, "verifier", out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert out.read_bytes() == seed_path(secured.home, "verifier").read_bytes()
    with pytest.raises(AuthError):
        export_seed(secured.home, "nobody", out)


@pytest.mark.asyncio
async def test_a_client_without_credentials_is_refused(secured: Hub) -> None:
    with pytest.raises(AuthError, match="requires credentials"):
        await connect(secured.url, "anonymous", wait_for_server=2)
    assert "authentication error" in _server_log(secured)
    stranger = secured.home.parent / "stranger.nk"
    from bus.auth import create_seed_file

    create_seed_file(stranger)
    with pytest.raises(AuthError, match="not accepted"):
        await connect(secured.url, "stranger", wait_for_server=2, auth=ClientAuth(stranger))


async def _as(hub: Hub, user: str) -> Client:
    return await connect(hub.url, f"test-{user}", auth=hub.auth(user))


@pytest.mark.asyncio
async def test_a_benchmarker_may_only_do_a_benchmarkers_job(secured: Hub) -> None:
    before = secured.store.last_position
    nc = await _as(secured, "benchmarker")
    js = jetstream(nc, timeout=1)
    try:
        finished = new_event(CampaignFinished, campaign_id="c1", actor=BENCHMARKER, reason="forged")
        written = new_event(
            KernelWritten,
            campaign_id="c1",
            actor=ActorRef(role="kernel-writer", instance="kw", host="h"),
            problem="softmax",
            target="cpu",
            candidate_id="c1:g0:c0",
            generation=0,
            template="evil",
            source="int main(){}",
            source_hash="0" * 64,
            flags=[],
            writer="template",
        )
        for forged in (finished, written):
            subject = event_subject(forged.campaign_id, forged.type, forged.subject_target)
            with pytest.raises(TimeoutError):  # the server drops it: no ack ever comes
                await js.publish(subject, encode(forged), timeout=1)
        with pytest.raises(TimeoutError):  # the planner's work is not the benchmarker's
            await nc.request(f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.kf-planner", b"1", timeout=1)
        with pytest.raises(TimeoutError):
            await js.delete_stream(STREAM)
        await nc.subscribe("kf.svc.kf-store.sql")  # refused by the server, asynchronously
        await nc.flush()
        lines = await _violations(secured, 5)
        assert any('Publish Violation - Subject "kf.ev.c1.CampaignFinished"' in x for x in lines)
        assert any('"kf.ev.c1.KernelWritten.cpu"' in x for x in lines)
        assert any("MSG.NEXT.KF_EVENTS.kf-planner" in x for x in lines)
        assert any("STREAM.DELETE.KF_EVENTS" in x for x in lines)
        assert any('Subscription Violation - Subject "kf.svc.kf-store.sql"' in x for x in lines)
        # what a benchmarker does emit still goes through
        await Emitter(js).emit(calibrated())
        await secured.wait_for_position(before + 1)
    finally:
        await nc.close()
    assert secured.store.query("SELECT type, count(*) FROM events GROUP BY type").rows == [
        ["HostCalibrated", 1]
    ]
    assert (await jetstream(secured.nc).stream_info(STREAM)).config.name == STREAM


@pytest.mark.asyncio
async def test_only_the_hub_answers_the_store(secured: Hub) -> None:
    for user in ("cli", "planner", "admin"):
        nc = await _as(secured, user)
        try:
            await nc.subscribe("kf.svc.kf-store.sql")
            await nc.flush()
        finally:
            await nc.close()
    lines = await _violations(secured, 3)
    assert sum('Subscription Violation - Subject "kf.svc.kf-store.sql"' in x for x in lines) == 3


@pytest.mark.asyncio
async def test_the_recorder_refuses_a_role_its_subject_does_not_allow(secured: Hub) -> None:
    nc = await _as(secured, "benchmarker")
    try:  # allowed on the subject (the benchmarker may emit KernelRejected) ...
        wrong = calibrated()
        await jetstream(nc).publish(
            event_subject("c1", "HostCalibrated"),
            encode(
                new_event(
                    type(wrong),
                    campaign_id="c1",
                    actor=ActorRef(role="planner", instance="p", host="h"),
                    device="x",
                    bandwidth_gbs=1.0,
                    peak_gflops=1.0,
                )
            ),
        )
    finally:
        await nc.close()
    await secured.wait_for_position(1)
    rows = secured.store.query("SELECT type, payload->>'reason' FROM events ORDER BY position").rows
    assert rows[0][0] == "EventRejected" and "role 'planner' may not emit" in rows[0][1]


@pytest.mark.asyncio
async def test_listening_beyond_loopback_needs_auth(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="without authentication"):
        async with running_hub(tmp_path / "home", listen="0.0.0.0", auth=False):
            pass


@pytest.mark.asyncio
async def test_tls_with_auth_carries_events_and_refuses_plain_clients(tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls")
    home = tmp_path / "home"
    async with running_hub(home, tls=TlsFiles(tls.cert, tls.key), ca_file=tls.ca) as hub:
        nc = await connect(hub.url, "bench", auth=hub.auth("benchmarker"))
        try:
            await Emitter(jetstream(nc)).emit(calibrated())
            await hub.wait_for_position(1)
        finally:
            await nc.close()
        plain = ClientAuth(seed_path(home, "benchmarker"))  # right user, no TLS
        with pytest.raises((ConnectionError, AuthError)):
            await connect(hub.url, "plain", auth=plain, wait_for_server=2)
