"""The contract every event store back end passes (memory and DuckDB file)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eventstore.codec import encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.events import Event
from eventstore.memory_store import MemoryEventStore
from eventstore.store import GENESIS, EventStore, Recorded, chain_hash
from tests.conftest import calibrated, started


def rec(event: Event, seq: int | None = None) -> Recorded:
    return Recorded(event, encode(event), seq)


@pytest.fixture(params=["memory", "duckdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EventStore]:
    backend: EventStore = (
        MemoryEventStore() if request.param == "memory" else DuckDBEventStore(tmp_path / "e.duckdb")
    )
    yield backend
    backend.close()


def test_positions_are_gap_free_from_one(store: EventStore) -> None:
    store.append([rec(started()) for _ in range(3)])
    store.append([rec(calibrated()) for _ in range(2)])
    assert [position for position, _ in store.replay()] == [1, 2, 3, 4, 5]
    assert store.last_position == 5


def test_append_is_idempotent_on_event_id(store: EventStore) -> None:
    first, second = started(), started()
    assert store.append([rec(first), rec(first)]) == (1, 1, 1)
    result = store.append([rec(first), rec(second)])
    assert (result.appended, result.duplicates) == (1, 1)
    assert [event.event_id for _, event in store.replay()] == [first.event_id, second.event_id]
    # No gap where the duplicate was dropped.
    assert [position for position, _ in store.replay()] == [1, 2]


def test_replay_returns_equal_events_by_campaign_and_position(store: EventStore) -> None:
    events = [started("a"), started("b"), calibrated("a"), calibrated("b")]
    store.append([rec(e) for e in events])
    assert [event for _, event in store.replay()] == events
    assert [event for _, event in store.replay("a")] == [events[0], events[2]]
    assert [event for _, event in store.replay(after_position=2)] == events[2:]
    assert [event for _, event in store.replay("b", after_position=2)] == [events[3]]


def test_chain_links_each_campaign_separately(store: EventStore) -> None:
    a1, b1, a2 = started("a"), started("b"), calibrated("a")
    store.append([rec(a1), rec(b1)])
    store.append([rec(a2)])
    hashes = [raw.chain_hash for raw in store.read_raw()]
    h_a1 = chain_hash(encode(a1), GENESIS)
    assert hashes == [h_a1, chain_hash(encode(b1), GENESIS), chain_hash(encode(a2), h_a1)]
    assert [raw.campaign_id for raw in store.read_raw("a")] == ["a", "a"]
    report = store.verify_chain()
    assert report.ok and report.events_checked == 3 and report.campaigns == 2


def test_stream_cursor_advances_with_the_batch(store: EventStore) -> None:
    assert store.stream_cursor == 0
    store.append([rec(started(), 7)], stream_cursor=7)
    store.append([], stream_cursor=9)  # a batch of only rejected messages still advances
    assert store.stream_cursor == 9


def test_an_empty_store_verifies(store: EventStore) -> None:
    report = store.verify_chain()
    assert report.ok and report.events_checked == 0


def test_an_old_schema_is_upcast_on_read(monkeypatch: pytest.MonkeyPatch) -> None:
    import msgspec

    from eventstore.codec import InvalidEvent, Upcasters, decode
    from eventstore.events import HostCalibrated

    old = msgspec.json.decode(encode(calibrated(bandwidth=36.0)))
    old["bandwidth"] = old.pop("bandwidth_gbs")  # how schema 1 spelled it, in this test
    raw = msgspec.json.encode(old)
    monkeypatch.setattr(HostCalibrated, "SCHEMA", 2)
    with pytest.raises(InvalidEvent, match="no upcaster for HostCalibrated schema 1"):
        decode(raw, Upcasters())
    upcasters = Upcasters()

    @upcasters.register("HostCalibrated", 1)
    def rename(event: dict[str, object]) -> dict[str, object]:
        event["bandwidth_gbs"] = event.pop("bandwidth")
        return event

    upgraded = decode(raw, upcasters)
    assert isinstance(upgraded, HostCalibrated)
    assert upgraded.bandwidth_gbs == 36.0 and upgraded.schema == 2
