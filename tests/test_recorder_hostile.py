"""Nothing that reaches the recorder can stop it, and the chain covers the stored bytes."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.connection import jetstream
from bus.publisher import MSG_ID_HEADER
from bus.subjects import event_subject
from eventstore.admission import admit
from eventstore.codec import MAX_DEPTH, InvalidEvent, encode
from eventstore.emitter import Emitter
from eventstore.events import EVENT_TYPES, ActorRef, CampaignFinished, new_event
from ops.hub import Hub
from tests.conftest import calibrated, started

CRAFTED = [b'{"type": ["x"]}', b"[" * 5000 + b"]" * 5000, b'{"a":' * 5000 + b"1" + b"}" * 5000]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=40,
)
envelope_like = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(EVENT_TYPES)) | json_values},
    optional={
        "event_id": json_values,
        "campaign_id": json_values,
        "actor": json_values,
        "ts": json_values,
        "schema": json_values,
    },
)


def _rejected(data: bytes, subject: str = "kf.ev.c1.CampaignStarted") -> str:
    with pytest.raises(InvalidEvent) as refused:
        admit(subject, data, None)
    return str(refused.value)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_take_only_the_rejection_path(data: bytes) -> None:
    _rejected(data)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_values | envelope_like)
def test_arbitrary_json_takes_only_the_rejection_path(value: Any) -> None:
    _rejected(json.dumps(value).encode())


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=MAX_DEPTH + 1, max_value=20_000), st.sampled_from("[{"))
def test_deep_nesting_is_refused_before_parsing(depth: int, opener: str) -> None:
    body = ('{"a":' * depth + "1" + "}" * depth) if opener == "{" else "[" * depth + "]" * depth
    assert "nested" in _rejected(body.encode())


def test_the_two_crafted_messages_are_rejections() -> None:
    assert "unknown event type" in _rejected(CRAFTED[0])
    assert "nested" in _rejected(CRAFTED[1])


def test_an_event_from_a_role_that_may_not_emit_it_is_refused() -> None:
    forged = new_event(
        CampaignFinished,
        campaign_id="c1",
        actor=ActorRef(role="benchmarker", instance="b-1", host="h"),
        reason="forged",
    )
    reason = _rejected(encode(forged), event_subject("c1", "CampaignFinished"))
    assert "may not emit CampaignFinished" in reason


def test_a_non_canonical_event_is_admitted_in_canonical_form() -> None:
    event = calibrated(bandwidth=1e16)
    spaced = json.dumps(msgspec.json.decode(encode(event)), indent=2).encode()
    admitted = admit(event_subject("c1", "HostCalibrated"), spaced, event.event_id)
    assert admitted.payload == encode(event) != spaced
    assert admitted.event == event


def _fuzz_corpus(seed: int, size: int) -> list[bytes]:
    rng = random.Random(seed)
    corpus = list(CRAFTED)
    while len(corpus) < size:
        kind = rng.randrange(4)
        if kind == 0:
            corpus.append(rng.randbytes(rng.randrange(1, 300)))
        elif kind == 1:
            corpus.append(json.dumps({"type": rng.choice(sorted(EVENT_TYPES))}).encode())
        elif kind == 2:
            depth = rng.randrange(MAX_DEPTH + 1, 3000)
            corpus.append(b"[" * depth + b"]" * depth)
        else:
            good = encode(started())
            cut = rng.randrange(1, len(good))
            corpus.append(good[:cut] + rng.randbytes(3) + good[cut:])
    return corpus


@pytest.mark.asyncio
async def test_the_recorder_survives_a_flood_of_hostile_input(hub: Hub) -> None:
    corpus = _fuzz_corpus(seed=10, size=3000)
    for index, data in enumerate(corpus):
        await hub.nc.publish(f"kf.ev.fuzz.CampaignStarted{index % 3 or ''}", data)
    await hub.nc.flush()
    after = started("after-flood")
    await Emitter(jetstream(hub.nc)).emit(after)
    await hub.wait_for_position(len(corpus) + 1, timeout=120)
    hub.check()  # the recorder is alive
    counts = hub.store.query("SELECT type, count(*) FROM events GROUP BY type ORDER BY type").rows
    assert counts == [["CampaignStarted", 1], ["EventRejected", len(corpus)]]
    assert hub.recorder.stats.rejected == len(corpus)
    assert hub.store.verify_chain().ok


@pytest.mark.asyncio
async def test_an_event_published_non_canonically_keeps_the_chain_verifiable(hub: Hub) -> None:
    event = calibrated(bandwidth=1e16)  # a JSON column would have rewritten 1e16
    spaced = json.dumps(msgspec.json.decode(encode(event)), indent=2).encode()
    subject = event_subject(event.campaign_id, event.type)
    await hub.nc.publish(subject, spaced, headers={MSG_ID_HEADER: event.event_id})
    await Emitter(jetstream(hub.nc)).emit(started())
    await hub.wait_for_position(2)
    stored = dict(hub.store.read_payloads())
    assert stored[1] == encode(event)
    assert next(e for _, e in hub.store.replay()) == event
    report = hub.store.verify_chain()
    assert report.ok and report.events_checked == 2
    assert hub.recorder.stats.reencoded == 1
