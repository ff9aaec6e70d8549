"""Issue 34, what remains: an attacker holding one role's credentials file, against one
real hub shared by this module (real nats-server, recorder, DuckDB).

Each attack test connects with only that role's seed (`Hub.auth(role)`, the file
`kfactory creds` hands out). The last test of the module runs a new campaign with every
cpu role on the same hub, after all the attacks: it must finish with every candidate
settled once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.errors import TimeoutError as NatsTimeout
from nats.js.kv import KV_DEL, KV_OP

from actors.campaign.history import History
from actors.runtime import Actor, ActorRuntime, Reactions, durable_name
from bus.connection import Client, Msg, connect, id_key, jetstream
from bus.consumer import WorkConsumer
from bus.follow import follow
from bus.lease import DEVICE_LEASES, LeaseBucket
from bus.service import ServiceError
from bus.streams import ensure_consumer
from bus.subjects import STREAM, campaign_filter, type_filters
from eventstore.causality import causality_claim
from eventstore.emitter import Emitter
from eventstore.events import (
    SYSTEM_CAMPAIGN,
    ActorRef,
    BenchmarkCompleted,
    Event,
    HeadToHeadRecord,
    HostCalibrated,
    KernelVerified,
    new_event,
)
from eventstore.ids import derived_event_id
from eventstore.queries import QueryFailed, query, replay
from ops.hub import Hub, running_hub
from ops.progress import Progress
from tests.test_actor_runtime import wait_rows
from tests.test_stalls import crew, run_campaign, settled_once, small_campaign

pytestmark = pytest.mark.xdist_group("one-role-forgeries")
module_loop = pytest.mark.asyncio(loop_scope="module")

VERIFIER = ActorRef(role="verifier", instance="verifier-1", host="bench-host")
BENCHMARKER = ActorRef(role="benchmarker", instance="benchmarker-1", host="bench-host")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hub(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Hub]:
    home: Path = tmp_path_factory.mktemp("forgeries") / "home"
    async with running_hub(home) as running:
        yield running


async def _as(hub: Hub, role: str) -> Client:
    return await connect(hub.url, f"attacker-{role}", auth=hub.auth(role))


def _work(campaign: str, candidate: str) -> dict[str, Any]:
    return {"problem": "softmax", "target": "cpu", "candidate_id": candidate, "generation": 0}


def _verified(campaign: str, candidate: str, source: str) -> KernelVerified:
    return new_event(
        KernelVerified,
        campaign_id=campaign,
        actor=VERIFIER,
        source_hash=source,
        max_rel_err=1e-7,
        trials=3,
        **_work(campaign, candidate),
    )


def _calibrated(device: str) -> HostCalibrated:
    return new_event(
        HostCalibrated,
        campaign_id=SYSTEM_CAMPAIGN,
        actor=BENCHMARKER,
        device=device,
        bandwidth_gbs=30.0,
        peak_gflops=100.0,
    )


def _timed(
    campaign: str, candidate: str, source: str, device: str, **claims: Any
) -> BenchmarkCompleted:
    return new_event(
        BenchmarkCompleted,
        campaign_id=campaign,
        actor=BENCHMARKER,
        source_hash=source,
        median_ns=1_000.0,
        iqr_ns=10.0,
        baseline="numpy float32",
        baseline_ns=1_800_000.0,
        speedup=1800.0,
        roofline_fraction=0.5,
        device=device,
        **claims,
        **_work(campaign, candidate),
    )


def _head_to_head() -> dict[str, Any]:
    record = HeadToHeadRecord(
        ratio_median=0.01, ratio_q1=0.01, ratio_q3=0.01, rounds=9, remeasured=False, faster=True
    )
    return {"incumbent": "champ", "speedup_vs_incumbent": 100.0, "head_to_head": record}


@pytest.mark.timeout(120)
@module_loop
async def test_a_benchmark_needs_its_verification_a_calibrated_device_and_the_incumbents_result(
    hub: Hub,
) -> None:
    """Attack 4: a BenchmarkCompleted for a kernel never verified (or of another source),
    on a device no benchmarker calibrated, or claiming a head-to-head win over a candidate
    with no recorded result, was stored and shown at 1800x."""
    campaign = "causal"
    cli = await _as(hub, "cli")
    followed = Applied()  # `kfactory run`'s follower
    following = await follow(
        cli, campaign_filter(campaign), Progress(followed, campaign, cli).on_message
    )
    noted = Noted()  # an actor reacting to benchmarks, as the librarian does
    listening = await _running(noted, hub)
    verifier = await _as(hub, "verifier")
    try:
        await Emitter(jetstream(verifier)).emit(_verified(campaign, "cv", "s1"))
    finally:
        await verifier.close()
    attacker = await _as(hub, "benchmarker")
    honest = _timed(campaign, "cv", "s1", "bench-host")
    forgeries = [
        _timed(campaign, "never-verified", "s1", "bench-host"),
        _timed(campaign, "cv", "another-source", "bench-host"),
        _timed(campaign, "cv", "s1", "cuda.gpu-host-7.0"),
        _timed(campaign, "cv", "s1", "bench-host", **_head_to_head()),
    ]
    try:
        await Emitter(jetstream(attacker)).emit(_calibrated("bench-host"))
        await Emitter(jetstream(attacker)).emit_many([*forgeries, honest])
    finally:
        await attacker.close()
    reasons = await wait_rows(
        hub,
        "SELECT payload->>'reason' FROM events WHERE type = 'EventRejected' "
        f"AND campaign_id = '{campaign}' ORDER BY position",
        len(forgeries),
    )
    await wait_rows(hub, "SELECT 1 FROM events WHERE type = 'BenchmarkCompleted'", 1)
    stored = hub.store.query(
        "SELECT event_id FROM events WHERE type = 'BenchmarkCompleted' "
        f"AND campaign_id = '{campaign}'"
    ).rows
    assert stored == [[honest.event_id]]
    try:
        while len(noted.seen) < 1 or honest.event_id not in followed.event_ids:
            await asyncio.sleep(0.1)
        await _recorded_all(hub)
        await asyncio.sleep(1.0)  # a refused one would be handled by now
    finally:
        await listening()
        await following.stop()
        await cli.close()
    assert [e.event_id for e in noted.seen] == [honest.event_id]
    assert [e.event_id for e in followed.applied if e.type == "BenchmarkCompleted"] == [
        honest.event_id
    ]
    said = [str(r[0]) for r in reasons]
    assert len(said) == len(forgeries), said
    assert "no KernelVerified" in said[0] and "no KernelVerified" in said[1]
    assert "no benchmarker calibrated" in said[2]
    assert "no recorded result of its own" in said[3]


class Applied(History):
    """A history that keeps every event applied to it."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: list[Event] = []

    def apply(self, position: int, event: Event) -> None:
        self.applied.append(event)
        super().apply(position, event)


class Noted(Actor):
    """Notes every benchmark its runtime hands it."""

    role = "librarian"
    reacts_to = (BenchmarkCompleted,)

    def __init__(self) -> None:
        self.seen: list[Event] = []

    async def handle(self, event: Event, out: Reactions) -> None:
        self.seen.append(event)


async def _running(
    actor: Actor, hub: Hub, nc: Client | None = None
) -> Callable[[], Awaitable[None]]:
    """Start `actor` on the hub as its role (on `nc`, a connection as that role, if
    given); the function returned stops it and closes the connection."""
    nc = nc or await _as(hub, actor.role)
    stop = asyncio.Event()
    task = asyncio.create_task(ActorRuntime(actor, nc, f"test-{actor.role}").run(stop))

    async def stopped() -> None:
        stop.set()
        await asyncio.wait_for(task, 30)
        await nc.close()

    return stopped


def test_the_audit_says_when_a_store_from_before_the_rule_breaks_it() -> None:
    """The same rule, re-derived over a history no recorder checked."""
    campaign = "old"
    history: list[Event] = [
        _calibrated("bench-host"),
        _verified(campaign, "cv", "s1"),
        _timed(campaign, "cv", "s1", "bench-host"),
    ]
    claim = causality_claim(enumerate(history, 1), campaign)
    assert claim.status == "agrees", claim
    forged = _timed(campaign, "cv", "s1", "cuda.gpu-host-7.0", **_head_to_head())
    claim = causality_claim(enumerate([*history, forged], 1), campaign)
    assert claim.status == "differs" and claim.position == 4, claim
    assert "no benchmarker calibrated" in claim.evidence


class FailsEverything(Actor):
    """A rogue benchmarker instance: every message it takes fails, at its first delivery."""

    role = "benchmarker"
    target = "cpu"
    reacts_to = (KernelVerified,)
    max_deliver = 1
    give_up_after = 0.0

    def __init__(self) -> None:
        self.failed = 0

    async def handle(self, event: Event, out: Reactions) -> None:
        self.failed += 1
        raise ValueError("rogue")


async def _recorded_all(hub: Hub) -> None:
    """Until the recorder has taken every message on the stream so far."""
    last = (await jetstream(hub.nc).stream_info(STREAM)).state.last_seq
    while hub.store.stream_cursor < last:
        await asyncio.sleep(0.1)


@pytest.mark.timeout(120)
@module_loop
async def test_dead_letters_are_one_per_candidate_however_many_messages_are_given_up_on(
    hub: Hub,
) -> None:
    """Attack 1: the benchmarkers recorded 3,020 DeadLettered for a flood; here 40 copies of
    a verification of one candidate, and one of another, each failed by a rogue instance."""
    campaign = "flood"
    copies = [_verified(campaign, "cx", "s1") for _ in range(40)] + [_verified(campaign, "cy", "s")]
    rogue = FailsEverything()
    stopped = await _running(rogue, hub)
    verifier = await _as(hub, "verifier")
    try:
        await Emitter(jetstream(verifier)).emit_many(copies)
        while rogue.failed < len(copies):
            await asyncio.sleep(0.1)
    finally:
        await stopped()
        await verifier.close()
    await _recorded_all(hub)
    dead = hub.store.query(
        "SELECT o.candidate_id FROM events e JOIN (SELECT event_id AS id, "
        "payload->>'candidate_id' AS candidate_id FROM events) o ON o.id = "
        "e.payload->>'original_event_id' WHERE e.type = 'DeadLettered' AND e.campaign_id = "
        f"'{campaign}' ORDER BY 1"
    ).rows
    assert dead == [["cx"], ["cy"]]


@pytest.mark.timeout(120)
@module_loop
async def test_one_roles_slow_queries_never_make_the_clis_select_1_wait(hub: Hub) -> None:
    """Attack 6: 8 parallel 40-second queries from one role made the cli's `SELECT 1` wait
    37 s (they held every thread of the store's SQL pool)."""
    slow = "SELECT count(*) FROM range(100000) a, range(100000) b WHERE (a.range * b.range) % 7 = 3"
    attacker = await _as(hub, "benchmarker")
    cli = await _as(hub, "cli")
    try:
        asks = [asyncio.create_task(query(attacker, slow, timeout=6)) for _ in range(8)]
        await asyncio.sleep(0.5)  # they are running (or queued)
        answer = await query(cli, "SELECT 1 AS one")
        waited_for = [ask for ask in asks if ask.done()]
        await asyncio.gather(*asks, return_exceptions=True)
    finally:
        await attacker.close()
        await cli.close()
    assert answer.rows == [[1]]
    assert waited_for == [], "the cli's query waited for the attacker's"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("role", ["verifier", "kernel-writer"])
@module_loop
async def test_a_sharing_role_can_neither_take_nor_release_a_timing_lease(
    hub: Hub, role: str
) -> None:
    """Attack 5: the verifier's credentials wrote a device timing lease (no TTL) and held
    the device; they could as well delete a benchmarker's. Only shared keys are its own,
    and the kernel writer's (the agent's tool runs)."""
    admin = await _as(hub, "admin")
    benchmarker = await _as(hub, "benchmarker")
    attacker = await _as(hub, role)
    try:
        timing = await LeaseBucket.open(jetstream(benchmarker), DEVICE_LEASES, 10)
        held = await timing.try_acquire("cpu.bench-host.timing", "benchmarker-1")
        assert held is not None
        kv = jetstream(attacker, timeout=1)
        with pytest.raises(TimeoutError):  # refused by the server: no ack comes
            await kv.publish(f"$KV.{DEVICE_LEASES}.cpu.gpu-host-7.timing", b'{"holder":"x"}')
        with pytest.raises(TimeoutError):
            await kv.publish(f"$KV.{DEVICE_LEASES}.cpu.bench-host.timing", headers={KV_OP: KV_DEL})
        watched = await LeaseBucket.open(jetstream(admin), DEVICE_LEASES, 10)
        assert await watched.current("cpu.gpu-host-7.timing") is None
        now = await watched.current("cpu.bench-host.timing")
        assert now is not None and now.holder == "benchmarker-1"
        shares = await LeaseBucket.open(jetstream(attacker), DEVICE_LEASES, 10)
        share = await shares.try_acquire(f"cpu.bench-host.shared.{role}-1", f"{role}-1")
        assert share is not None  # what it needs still works
        assert await shares.release(share)
        assert await timing.release(held)
    finally:
        await attacker.close()
        await benchmarker.close()
        await admin.close()


@pytest.mark.timeout(60)
@module_loop
async def test_the_roles_that_never_read_history_cannot_read_the_store(hub: Hub) -> None:
    """Smaller item: any role could read the whole store (every campaign's kernels)
    through the store service; the verifier's credentials sit on every GPU host."""
    for role in ("verifier", "compiler", "fuser"):
        nc = await _as(hub, role)
        try:
            with pytest.raises(ServiceError, match="may not read the store") as refused:
                await replay(nc, timeout=10)
            assert refused.value.code == 403
            with pytest.raises(QueryFailed, match="may not read the store"):
                await query(nc, "SELECT count(*) FROM events")
        finally:
            await nc.close()
    calibration = _calibrated("readers-host")
    for role in ("benchmarker", "cli"):  # the roles that replay history still do
        nc = await _as(hub, role)
        try:
            if role == "benchmarker":
                await Emitter(jetstream(nc)).emit(calibration)
                stored = f"SELECT 1 FROM events WHERE event_id = '{calibration.event_id}'"
                await wait_rows(hub, stored, 1)
            read = await replay(nc, types=["HostCalibrated"], timeout=10)
            assert calibration.event_id in {e.event_id for _, e in read}
        finally:
            await nc.close()


class TimesEveryVerification(Actor):
    """An honest benchmarker of the campaigns `preempt` and `naks`: answers each
    verification with a result."""

    role = "benchmarker"
    target = "cpu"
    reacts_to = (KernelVerified,)

    async def handle(self, event: Event, out: Reactions) -> None:
        assert isinstance(event, KernelVerified)
        if event.campaign_id not in ("preempt", "naks"):
            return
        timed = _timed(event.campaign_id, event.candidate_id, event.source_hash, "preempt-host")
        out.emit(BenchmarkCompleted, **{k: getattr(timed, k) for k in _RESULT_FIELDS})


_RESULT_FIELDS = ("median_ns", "iqr_ns", "baseline", "baseline_ns", "speedup")
_RESULT_FIELDS += ("roofline_fraction", "device", "source_hash", *_work("", "").keys())


@pytest.mark.timeout(120)
@module_loop
async def test_no_other_role_can_take_the_id_a_benchmarker_will_answer_under(hub: Hub) -> None:
    """Attack 4, last item: a forgery published under the id the real benchmarker would
    derive made the real result vanish as a duplicate (JetStream dedupes a Nats-Msg-Id
    across the stream, the store an event id). The verifier, which publishes the cause,
    publishes a legal event of its own first under every id it can derive for the answer."""
    campaign = "preempt"
    benchmarker = await _as(hub, "benchmarker")
    verifier = await _as(hub, "verifier")
    cause = _verified(campaign, "c1", "s1")
    guesses = {
        derived_event_id(cause.event_id, "benchmarker", 0, key=key)
        for key in (b"", id_key(verifier))
    }
    squatters = [
        new_event(
            KernelVerified,
            event_id=guess,
            campaign_id=campaign,
            actor=VERIFIER,
            source_hash="s2",
            max_rel_err=1e-7,
            trials=3,
            **_work(campaign, f"squat-{index}"),
        )
        for index, guess in enumerate(sorted(guesses))
    ]
    try:
        await Emitter(jetstream(benchmarker)).emit(_calibrated("preempt-host"))
        await Emitter(jetstream(verifier)).emit_many([cause, *squatters])
    finally:
        await verifier.close()
    await wait_rows(hub, f"SELECT 1 FROM events WHERE event_id = '{squatters[-1].event_id}'", 1)
    stopped = await _running(TimesEveryVerification(), hub, benchmarker)
    try:
        found = await wait_rows(
            hub,
            "SELECT event_id, payload->>'candidate_id' FROM events "
            f"WHERE type = 'BenchmarkCompleted' AND campaign_id = '{campaign}' "
            "AND payload->>'candidate_id' = 'c1'",
            1,
            timeout=30,
        )
    finally:
        await stopped()
    assert len(found) == 1, "the benchmarker's result vanished as a duplicate of a squatter"
    assert found[0][0] not in guesses


@pytest.mark.timeout(120)
@module_loop
async def test_a_rogue_instance_naking_everything_cannot_run_a_candidate_out(hub: Hub) -> None:
    """Attack 5, last item: a rogue instance that NAKs everything dead-lettered 3
    candidates within a minute (the server's delivery limit, reached by NAKs in a moment).
    Here it NAKs each 3 candidates' message 200 times, or for 20 s; then an honest
    instance settles every one, and nothing was dead-lettered."""
    campaign, naks = "naks", 200
    benchmarker = await _as(hub, "benchmarker")
    js = jetstream(benchmarker)
    durable = durable_name("benchmarker", "cpu")

    async def never(message: Msg, reason: str = "") -> None:
        raise AssertionError("a bare configuration handles nothing")

    configured = WorkConsumer(js, durable, type_filters(["KernelVerified"], "cpu"), never, never)
    await ensure_consumer(js, configured.config)  # as the role's instances declare it
    verifier = await _as(hub, "verifier")
    candidates = [f"n{index}" for index in range(3)]
    try:
        await Emitter(js).emit(_calibrated("preempt-host"))
        await Emitter(jetstream(verifier)).emit_many(
            [_verified(campaign, candidate, "s1") for candidate in candidates]
        )
    finally:
        await verifier.close()
    rogue = await js.pull_subscribe_bind(durable=durable, stream=STREAM)
    naked: dict[str, int] = dict.fromkeys(candidates, 0)
    until = asyncio.get_running_loop().time() + 20
    while min(naked.values()) < naks and asyncio.get_running_loop().time() < until:
        with contextlib.suppress(NatsTimeout):
            for message in await rogue.fetch(10, timeout=0.2):
                candidate = str(json.loads(message.data).get("candidate_id"))
                if candidate in naked:
                    naked[candidate] += 1
                await message.nak()
    await rogue.unsubscribe()
    assert min(naked.values()) >= naks, naked
    stopped = await _running(TimesEveryVerification(), hub, benchmarker)
    try:
        settled = await wait_rows(
            hub,
            "SELECT payload->>'candidate_id' FROM events WHERE type = 'BenchmarkCompleted' "
            f"AND campaign_id = '{campaign}' ORDER BY 1",
            len(candidates),
        )
    finally:
        await stopped()
    await _recorded_all(hub)
    dead = hub.store.query(
        f"SELECT count(*) FROM events WHERE type = 'DeadLettered' AND campaign_id = '{campaign}'"
    ).rows
    assert settled == [[candidate] for candidate in candidates]
    assert dead == [[0]]


@pytest.mark.timeout(300)
@module_loop
async def test_after_the_attacks_a_new_campaign_finishes_with_every_candidate_settled_once(
    hub: Hub,
) -> None:
    """Last in the module: every cpu role, on the hub every attack above was made against."""
    spec = small_campaign("after-attacks", budget=4, per_generation=2)
    async with crew(hub):
        result = await run_campaign(hub, spec, timeout=240)
    assert str(result["finished"]).startswith("budget reached"), result
    events = [e for _, e in await replay(hub.nc, campaign_id=spec.campaign_id, timeout=10)]
    counts = settled_once(events)
    assert len(counts) == 4 and set(counts.values()) == {1}, counts
