"""An in-process event store for fast unit tests; same contract as the DuckDB store."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from eventstore.store import EventStore, Fence, RawRow, Row, check_fence


class MemoryEventStore(EventStore):
    def __init__(self) -> None:
        super().__init__()
        self._rows: list[Row] = []
        self._ids: set[str] = set()

    def _write(self, rows: list[Row], stream_cursor: int | None, fence: Fence | None) -> bool:
        if fence is not None:
            check_fence(self._fence, fence, "this store")
        if any(row.event.event_id in self._ids for row in rows):
            return False
        self._rows.extend(rows)
        self._ids.update(row.event.event_id for row in rows)
        return True

    def _stored_ids(self, event_ids: Iterable[str]) -> set[str]:
        return self._ids.intersection(event_ids)

    def read_raw(self, campaign_id: str | None = None, after_position: int = 0) -> Iterator[RawRow]:
        for row in self._rows[after_position:]:
            if campaign_id is None or row.event.campaign_id == campaign_id:
                yield RawRow(
                    row.position, row.event.campaign_id, row.payload, row.chain_hash, row.stream_seq
                )

    def read_payloads(
        self, campaign_id: str | None = None, after_position: int = 0
    ) -> Iterator[tuple[int, bytes]]:
        for raw in self.read_raw(campaign_id, after_position):
            yield raw.position, raw.payload

    def close(self) -> None:
        pass
