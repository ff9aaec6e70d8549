"""Issue 34: an attacker holding one role's credentials file, against a real hub.

Each test connects with only that role's seed (`Hub.auth(role)`, the file `kfactory creds`
hands out) and publishes what the bus lets that role publish; what it must not achieve
is checked on the recorder, `kfactory run`'s follower and an actor's runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from actors.campaign.campaign_file import CampaignSpec
from actors.campaign.history import History
from actors.runtime import Actor, ActorRuntime, Reactions
from bus.connection import Client, connect, jetstream
from bus.consumer import CHECK_EVERY
from bus.follow import follow
from bus.lease import (
    DEVICE_LEASES,
    MAX_LEASE_AGE,
    LeaseBucket,
    ensure_lease_bucket,
    kv_stream,
)
from bus.subjects import STREAM, SubjectError, campaign_filter, check_campaign_id
from eventstore.codec import encode
from eventstore.emitter import Emitter
from eventstore.events import (
    ActorRef,
    BenchmarkCompleted,
    CampaignFinished,
    CampaignStarted,
    Event,
    LessonLearned,
    new_event,
)
from eventstore.queries import (
    MAX_ROWS,
    PAGES_KEPT_BYTES,
    PageRequest,
    _Pages,
    query,
    replay,
)
from ops.hub import Hub, running_hub
from ops.progress import Progress
from tests.conftest import calibrated
from tests.test_actor_runtime import wait_rows

PLANNER = ActorRef(role="planner", instance="planner-1", host="h")
CLI = ActorRef(role="cli", instance="cli-1", host="h")


def _started(campaign: str) -> CampaignStarted:
    spec = CampaignSpec(problem="softmax", target="cpu", shapes=[[4, 64]])
    return new_event(
        CampaignStarted,
        campaign_id=campaign,
        actor=CLI,
        name=campaign,
        problem="softmax",
        target="cpu",
        config=spec.to_config(),
    )


@pytest_asyncio.fixture
async def secured(tmp_path: Path) -> AsyncIterator[Hub]:
    async with running_hub(tmp_path / "home") as hub:
        yield hub


async def _as(hub: Hub, role: str) -> Client:
    return await connect(hub.url, f"attacker-{role}", auth=hub.auth(role))


def _forged_finish(campaign: str = "c1") -> CampaignFinished:
    return new_event(CampaignFinished, campaign_id=campaign, actor=PLANNER, reason="FORGED")


class Listener(Actor):
    """A librarian-like actor that notes every event its runtime hands it."""

    role = "librarian"
    reacts_to = (BenchmarkCompleted,)

    def __init__(self) -> None:
        self.seen: list[Event] = []

    async def handle(self, event: Event, out: Reactions) -> None:
        self.seen.append(event)


@contextlib.asynccontextmanager
async def _running(actor: Actor, hub: Hub) -> AsyncIterator[None]:
    nc = await connect(hub.url, "listener", auth=hub.auth(actor.role))
    stop = asyncio.Event()
    task = asyncio.create_task(ActorRuntime(actor, nc).run(stop))
    try:
        await wait_rows(hub, "SELECT 1 FROM events WHERE type = 'ActorStarted'", 1)
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await nc.close()


@pytest.mark.asyncio
async def test_a_payload_on_another_types_subject_reaches_no_follower(secured: Hub) -> None:
    """Attack 2: a CampaignFinished on the benchmarker's BenchmarkCompleted subject, and
    junk there too; `run`'s follower must not finish, an actor must not see either, and
    the junk must cost no dead letters (attack 1: the flood)."""
    start = _started("c1")
    progress = Progress(History(), "c1")
    following = await follow(secured.nc, campaign_filter("c1"), progress.on_message)
    listener = Listener()
    attacker = await _as(secured, "benchmarker")
    cli = await _as(secured, "cli")
    try:
        async with _running(listener, secured):
            await Emitter(jetstream(cli)).emit(start)
            js = jetstream(attacker)
            await js.publish("kf.ev.c1.BenchmarkCompleted", encode(_forged_finish()))
            for i in range(30):
                await js.publish("kf.ev.c1.BenchmarkCompleted", b"junk %d" % i)
            rejected = await wait_rows(
                secured, "SELECT 1 FROM events WHERE type = 'EventRejected'", 31
            )
            assert len(rejected) == 31
            await asyncio.sleep(1.0)  # the actor and the follower had their chance
        assert not progress.finished, "run's follower took the forged CampaignFinished"
        assert listener.seen == []
        dead = secured.store.query("SELECT count(*) FROM events WHERE type = 'DeadLettered'")
        assert dead.rows == [[0]]
    finally:
        await following.stop()
        await attacker.close()
        await cli.close()


@pytest.mark.asyncio
async def test_a_dotted_campaign_id_cannot_forge_another_type(secured: Hub) -> None:
    """Attack 3: `kf.ev.X.BenchmarkCompleted.CampaignFinished` is the benchmarker's subject
    (a BenchmarkCompleted for target `CampaignFinished`) and also the subject of a
    CampaignFinished of campaign `X.BenchmarkCompleted`."""
    attacker = await _as(secured, "benchmarker")
    try:
        forged = _forged_finish("X.BenchmarkCompleted")
        lesson = new_event(
            LessonLearned,
            campaign_id="X.BenchmarkCompleted",
            actor=ActorRef(role="librarian", instance="l", host="h"),
            generation=0,
            kind="lineage",
            statement="forged",
            evidence_ids=[],
        )
        js = jetstream(attacker)
        await js.publish("kf.ev.X.BenchmarkCompleted.CampaignFinished", encode(forged))
        await js.publish("kf.ev.X.BenchmarkCompleted.LessonLearned", encode(lesson))
    finally:
        await attacker.close()
    rows = await wait_rows(secured, "SELECT type, campaign_id FROM events", 2)
    assert [r[0] for r in rows] == ["EventRejected", "EventRejected"], rows
    assert all(r[1] != "X.BenchmarkCompleted" for r in rows)


def test_campaign_ids_are_safe_tokens_where_they_enter() -> None:
    for bad in ("X.BenchmarkCompleted", "a b", "*", ">", "a:b", "x" * 65, ""):
        with pytest.raises(SubjectError):
            check_campaign_id(bad)
    assert check_campaign_id("softmax-cpu-1a2b3c4d") == "softmax-cpu-1a2b3c4d"


def test_a_store_holding_a_forgery_from_before_the_rule_does_not_show_it() -> None:
    """A store written before the rule may hold the dotted forgery; no projection uses it."""
    history = History()
    history.apply(1, _started("X"))
    history.apply(2, _forged_finish("X.BenchmarkCompleted"))
    assert set(history.campaigns) == {"X"}
    assert history.campaigns["X"].finished is None


@pytest.mark.asyncio
async def test_a_flood_of_big_junk_cannot_wedge_replay(secured: Hub) -> None:
    """Attack 1: the rejections of a junk flood from the verifier's credentials are each
    a few KiB; a replay page of them by count alone passed NATS's 1 MiB, and every role
    that replays (the planner, the benchmarkers) saw StoreUnavailable for ever."""
    attacker = await _as(secured, "verifier")
    try:
        js = jetstream(attacker)
        for i in range(600):
            await js.publish("kf.ev.c1.KernelVerified.cpu", b"%05d" % i + b"j" * 4000)
    finally:
        await attacker.close()
    await secured.wait_for_position(600)
    planner = await _as(secured, "planner")
    try:
        events = await replay(planner, campaign_id="c1", timeout=10)
    finally:
        await planner.close()
    assert len(events) == 600 and {e.type for _, e in events} == {"EventRejected"}


@pytest.mark.asyncio
async def test_a_caller_cannot_raise_the_servers_sql_caps(secured: Hub) -> None:
    """Attack 6: `timeout=1e308` and `max_rows=1e12` were taken as asked."""
    cli = await _as(secured, "cli")
    try:
        result = await query(cli, "SELECT * FROM range(150000)", max_rows=10**12, timeout=1e308)
        lowered = await query(cli, "SELECT * FROM range(100)", max_rows=10)
    finally:
        await cli.close()
    assert result.truncated and len(result.rows) == MAX_ROWS
    assert lowered.truncated and len(lowered.rows) == 10


@pytest.mark.asyncio
async def test_the_cli_cannot_delete_a_work_consumer_and_a_lost_one_comes_back(
    secured: Hub,
) -> None:
    """Attack 5: the cli user deleted `kf-benchmarker-cpu`; nothing created it again."""
    listener = Listener()
    cli = await _as(secured, "cli")
    try:
        async with _running(listener, secured):
            with pytest.raises(TimeoutError):  # refused by the server: no answer comes
                await jetstream(cli, timeout=1).delete_consumer(STREAM, "kf-librarian")
            assert (await jetstream(secured.nc).consumer_info(STREAM, "kf-librarian")).name
            # the admin may; the actor then creates its consumer again and goes on
            admin = await _as(secured, "admin")
            try:
                await jetstream(admin).delete_consumer(STREAM, "kf-librarian")
            finally:
                await admin.close()
            await asyncio.sleep(CHECK_EVERY + 2)
            info = await jetstream(secured.nc).consumer_info(STREAM, "kf-librarian")
            assert info.name == "kf-librarian"
    finally:
        await cli.close()


@pytest.mark.asyncio
async def test_a_lease_written_without_a_ttl_does_not_last(secured: Hub) -> None:
    """Attack 5: the verifier's credentials wrote a device lease with no TTL; it held the
    device for 6 minutes and a restart. The bucket now bounds every write's age, even of
    the benchmarker's (the verifier may write only shared leases now)."""
    info = await jetstream(secured.nc).stream_info(kv_stream(DEVICE_LEASES))
    assert 0 < info.config.max_age <= MAX_LEASE_AGE
    admin = await _as(secured, "admin")
    attacker = await _as(secured, "benchmarker")
    try:  # the same rule, bounded at 2 s here to see it act within a test's time
        await ensure_lease_bucket(jetstream(admin), DEVICE_LEASES, max_age=2)
        subject = f"$KV.{DEVICE_LEASES}.cpu-h"
        await jetstream(attacker).publish(subject, b'{"holder":"squatter"}')
        leases = await LeaseBucket.open(jetstream(admin), DEVICE_LEASES, 1)
        assert (await leases.current("cpu-h")) is not None
        await asyncio.sleep(3)
        assert (await leases.current("cpu-h")) is None
    finally:
        await attacker.close()
        await admin.close()


@pytest.mark.asyncio
async def test_slow_queries_never_hold_the_recorders_writes(secured: Hub) -> None:
    """Attack 6: 8 parallel 40-second queries delayed the recording of an event by 37 s
    (the queries filled the thread pool the recorder's appends run in)."""
    slow = "SELECT count(*) FROM range(100000) a, range(100000) b WHERE (a.range * b.range) % 7 = 3"
    cli = await _as(secured, "cli")
    benchmarker = await _as(secured, "benchmarker")
    flood = min(32, (os.cpu_count() or 1) + 4) + 2  # more than the default executor holds
    try:
        asks = [asyncio.create_task(query(cli, slow, timeout=6)) for _ in range(flood)]
        await asyncio.sleep(0.5)  # they are running (or queued)
        await Emitter(jetstream(benchmarker)).emit(calibrated())
        await secured.wait_for_position(1)
        assert not any(ask.done() for ask in asks), "the event waited for a query"
        await asyncio.gather(*asks, return_exceptions=True)
    finally:
        await cli.close()
        await benchmarker.close()


def test_results_never_fetched_are_bounded_in_memory() -> None:
    """Attack 6: results asked for and never fetched grew the hub from 226 to 594 MB."""
    pages = _Pages()
    firsts = [pages.first(b"x" * (2 * 1024 * 1024)) for _ in range(60)]  # 120 MB unfetched
    assert pages.kept_bytes() <= PAGES_KEPT_BYTES
    newest = firsts[-1]
    assert pages.page(PageRequest(newest.result_id, 1)).chunk  # the newest is still there
