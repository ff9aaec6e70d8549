"""Reading a store file read-only, row by row as stored: what replay, audit, reports and
exports start from.

Every row comes back with every stored column: those the store derives from the payload
(id, campaign, type, schema, time, actor, causation, correlation), the bus sequence, the
exact payload bytes and the chain hash, so an audit can check both the chain (which
covers the payload and the sequence) and that the other columns still say what the
payload says.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import duckdb

from eventstore.codec import decode
from eventstore.duckdb_store import open_connection
from eventstore.events import Event


class StoredRow(NamedTuple):
    position: int
    event_id: str
    campaign_id: str
    type: str
    actor_role: str
    ts: datetime
    payload: bytes
    chain_hash: bytes
    stream_seq: int | None = None
    schema: int | None = None
    actor_instance: str | None = None
    actor_host: str | None = None
    causation_id: str | None = None
    correlation_id: str | None = None


_COLUMNS = (
    "position, event_id, campaign_id, type, actor_role, ts, encode(payload::VARCHAR), "
    "chain_hash, stream_seq, schema, actor_instance, actor_host, causation_id, correlation_id"
)
"""`encode` gives the stored text's UTF-8 bytes; a JSON-to-BLOB cast would re-serialise the
JSON (1e-6 becomes 0.000001) and no longer be what was hashed."""
_PAYLOADS = "position, encode(payload::VARCHAR)"


class Snapshot:
    """A read-only view of one store file (DuckDB allows no reader beside a writer)."""

    def __init__(self, path: Path) -> None:
        if not path.exists():
            raise FileNotFoundError(f"no event store at {path}")
        self.path = path
        self.conn = open_connection(path, read_only=True)

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    def rows(
        self, campaign_id: str | None = None, types: list[str] | None = None
    ) -> Iterator[StoredRow]:
        """Stored rows in position order, optionally one campaign's, of some types."""
        for columns in self._batches(_COLUMNS, campaign_id, types):
            yield from map(StoredRow._make, zip(*columns, strict=True))

    def events(
        self, campaign_id: str | None = None, types: list[str] | None = None
    ) -> Iterator[tuple[int, Event]]:
        """(position, decoded event) in position order (only those two columns read)."""
        for positions, payloads in self._batches(_PAYLOADS, campaign_id, types):
            for position, payload in zip(positions, payloads, strict=True):
                yield position, decode(payload)

    def _batches(
        self, columns: str, campaign_id: str | None, types: list[str] | None
    ) -> Iterator[list[list[Any]]]:
        where = ["true"]
        params: dict[str, Any] = {}
        if campaign_id is not None:
            where.append("campaign_id = $campaign")
            params["campaign"] = campaign_id
        if types:
            where.append("list_contains($types, type)")
            params["types"] = types
        sql = f"SELECT {columns} FROM events WHERE {' AND '.join(where)} ORDER BY position"
        cursor = self.conn.cursor()
        try:
            for batch in cursor.sql(sql, params=params).to_arrow_reader(100_000):
                yield [column.to_pylist() for column in batch.columns]
        finally:
            cursor.close()

    def positions(self) -> list[int]:
        """Every stored position, in order (a gap-free store has 1..n)."""
        found = self.conn.execute("SELECT position FROM events ORDER BY position").fetchnumpy()
        return [int(p) for p in found["position"]]

    def campaign_ids(self) -> list[str]:
        rows = self.conn.execute(
            "SELECT campaign_id FROM events WHERE type = 'CampaignStarted' ORDER BY position"
        ).fetchall()
        return [str(r[0]) for r in rows]

    def last_times(self) -> dict[str, datetime]:
        """Per campaign, the time of its last stored event."""
        rows = self.conn.execute("SELECT campaign_id, max(ts) FROM events GROUP BY campaign_id")
        return {str(c): ts for c, ts in rows.fetchall()}

    def heads(self) -> dict[str, tuple[int, bytes]]:
        """Per campaign: the position and chain hash of its last stored event."""
        rows = self.conn.execute(
            "SELECT campaign_id, max(position), arg_max(chain_hash, position) FROM events "
            "GROUP BY campaign_id ORDER BY min(position)"
        ).fetchall()
        return {str(c): (int(p), bytes(h)) for c, p, h in rows}


def open_snapshot(path: Path) -> Snapshot:
    """Open `path` read-only; StoreLocked (one line) when a running server owns it."""
    try:
        return Snapshot(path)
    except duckdb.Error as exc:
        raise OSError(f"cannot read {path}: {exc}") from exc
