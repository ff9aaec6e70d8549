"""The DuckDB event store. One process owns the file read-write (the recorder); queries
from everyone else reach it over request/reply, or open the file read-only when no
owner runs.

Rows go in as Arrow micro-batches inside one transaction per batch; `event_id` has a
unique index, so a batch that repeats a stored event is detected by the database and
re-sequenced without it. `payload` is a VARCHAR holding the canonical bytes verbatim:
DuckDB's JSON type would re-format numbers, and the stored bytes would no longer be the
hashed ones (an older store's JSON column is converted on open). The same transaction
writes `store_cursor`: the last KF_EVENTS sequence recorded and the recording lease's
token and scope, the stored fence being read inside the transaction that writes.

`query` runs one read-only statement (`sql_guard`) on a cursor of its own, in a
transaction that is always rolled back, on a connection with external access disabled
and its configuration locked, and interrupts it after its timeout
(`DEFAULT_QUERY_TIMEOUT`, 30 s, unless the caller says). With no owner running,
`kfactory sql` opens the file read-only and queries it with the same limits; while one
runs, opening the file raises StoreLocked.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import msgspec

from eventstore.codec import decode
from eventstore.events import Event
from eventstore.sql_guard import check_read_only
from eventstore.store import EventStore, Fence, RawRow, Row, check_fence
from eventstore.views import create_views

if TYPE_CHECKING:
    import pyarrow as pa

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS events (
    position       BIGINT      NOT NULL,  -- gap-free global order, from 1
    event_id       VARCHAR     NOT NULL,
    campaign_id    VARCHAR     NOT NULL,
    type           VARCHAR     NOT NULL,
    schema         INTEGER     NOT NULL,
    ts             TIMESTAMPTZ NOT NULL,
    actor_role     VARCHAR     NOT NULL,
    actor_instance VARCHAR     NOT NULL,
    actor_host     VARCHAR     NOT NULL,
    causation_id   VARCHAR,
    correlation_id VARCHAR,
    stream_seq     BIGINT,                -- KF_EVENTS sequence it arrived with
    payload        VARCHAR     NOT NULL,  -- the canonical event JSON, verbatim, hashed in the chain
    chain_hash     BLOB        NOT NULL   -- sha256(payload || previous hash in the campaign)
);
CREATE UNIQUE INDEX IF NOT EXISTS events_event_id ON events (event_id);
CREATE TABLE IF NOT EXISTS store_cursor (
    id        INTEGER PRIMARY KEY,
    last_seq  BIGINT NOT NULL               -- last KF_EVENTS sequence recorded
);
-- The recording lease the last batch was written under (bus/lease.py): a recorder with
-- an older token of the same lease bucket is refused.
ALTER TABLE store_cursor ADD COLUMN IF NOT EXISTS lease_token BIGINT;
ALTER TABLE store_cursor ADD COLUMN IF NOT EXISTS lease_scope VARCHAR;
"""


@functools.cache
def _arrow_schema() -> pa.Schema:
    import pyarrow as pa  # only a writer needs it: a read-only command starts sooner

    return pa.schema(
        [
            ("position", pa.int64()),
            ("event_id", pa.string()),
            ("campaign_id", pa.string()),
            ("type", pa.string()),
            ("schema", pa.int32()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("actor_role", pa.string()),
            ("actor_instance", pa.string()),
            ("actor_host", pa.string()),
            ("causation_id", pa.string()),
            ("correlation_id", pa.string()),
            ("stream_seq", pa.int64()),
            ("payload", pa.string()),
            ("chain_hash", pa.binary()),
        ]
    )


class StoreLocked(RuntimeError):
    """Another process owns the DuckDB file."""


#: Seconds a user query may run before it is interrupted.
DEFAULT_QUERY_TIMEOUT = 30.0


class QueryTimeout(RuntimeError):
    """A query ran past its time limit and was interrupted."""


class QueryResult(msgspec.Struct, frozen=True):
    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool = False


def open_connection(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    try:
        return duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            raise StoreLocked(
                f"{path} is in use by another process (a running `kfactory server` owns it); "
                "query it through the server with --nats URL"
            ) from exc
        raise


def _owner_only(path: Path) -> None:
    """The store and its WAL readable by their owner alone (the events hold kernels and
    campaign files; DuckDB creates them by the umask)."""
    for file in (path, path.with_name(path.name + ".wal")):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(file, 0o600)


class DuckDBEventStore(EventStore):
    def __init__(self, path: Path | str, read_only: bool = False) -> None:
        super().__init__()
        self.path = Path(path)
        self.read_only = read_only
        if read_only and not self.path.exists():
            raise FileNotFoundError(f"no event store at {self.path}")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = open_connection(self.path, read_only)
        self._lock = threading.Lock()
        self._queries: set[duckdb.DuckDBPyConnection] = set()  # cursors of running queries
        self._closing = False
        if not read_only:
            self._conn.execute(SCHEMA_SQL)
            _owner_only(self.path)
            self._keep_payload_verbatim()
            create_views(self._conn)  # candidates, leaderboard, lessons, ...
            # Small frequent commits: checkpoint the WAL rarely (it doubles append speed;
            # the cost is a longer WAL replay after a crash).
            self._conn.execute("SET checkpoint_threshold = '512MB'")
        # Queries never need the file system: no read_csv('/etc/...'), no ATTACH, no COPY.
        self._conn.execute("SET enable_external_access = false")
        self._conn.execute("SET lock_configuration = true")
        self._load_heads()

    def _keep_payload_verbatim(self) -> None:
        """Stores made before payload was VARCHAR: a JSON column re-formats numbers (1e16
        becomes 10000000000000000.0), so the stored bytes would differ from the hashed ones."""
        kind = self._conn.execute(
            "SELECT data_type FROM information_schema.columns "
            "WHERE table_name = 'events' AND column_name = 'payload'"
        ).fetchone()
        if kind is not None and kind[0] == "JSON":
            self._conn.execute("DROP INDEX events_event_id")
            self._conn.execute("ALTER TABLE events ALTER payload TYPE VARCHAR")
            self._conn.execute("CREATE UNIQUE INDEX events_event_id ON events (event_id)")

    def _load_heads(self) -> None:
        position = self._conn.execute("SELECT coalesce(max(position), 0) FROM events").fetchone()
        self._last_position = int(position[0]) if position else 0
        heads = self._conn.execute(
            "SELECT campaign_id, arg_max(chain_hash, position) FROM events GROUP BY campaign_id"
        ).fetchall()
        self._heads = {campaign: bytes(head) for campaign, head in heads}
        cursor = self._conn.execute("SELECT max(last_seq) FROM store_cursor").fetchone()
        self._stream_cursor = int(cursor[0]) if cursor and cursor[0] is not None else 0
        self._fence = self._stored_fence()

    def _stored_fence(self) -> Fence | None:
        if not self._has_fence_columns():
            return None  # a read-only store made before fencing
        found = self._conn.execute(
            "SELECT lease_token, lease_scope FROM store_cursor WHERE id = 1"
        ).fetchone()
        if found is None or found[0] is None:
            return None
        return Fence(int(found[0]), str(found[1] or ""))

    def _has_fence_columns(self) -> bool:
        found = self._conn.execute(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_name = 'store_cursor' AND column_name = 'lease_token'"
        ).fetchone()
        return bool(found and found[0])

    def _write(self, rows: list[Row], stream_cursor: int | None, fence: Fence | None) -> bool:
        if not rows and stream_cursor is None and fence is None:
            return True
        batch = _to_arrow(rows)
        with self._lock:
            self._conn.execute("BEGIN TRANSACTION")
            try:
                self._conn.register("kf_batch", batch)
                if fence is not None:  # read inside the transaction that writes
                    check_fence(self._stored_fence(), fence, str(self.path))
                if rows:
                    self._conn.execute("INSERT INTO events SELECT * FROM kf_batch")
                if stream_cursor is not None or fence is not None:
                    last_seq = self._stream_cursor if stream_cursor is None else stream_cursor
                    self._conn.execute(
                        "INSERT INTO store_cursor (id, last_seq, lease_token, lease_scope) "
                        "VALUES (1, $seq, $token, $scope) ON CONFLICT (id) DO UPDATE SET "
                        "last_seq = excluded.last_seq, "
                        "lease_token = coalesce(excluded.lease_token, store_cursor.lease_token), "
                        "lease_scope = coalesce(excluded.lease_scope, store_cursor.lease_scope)",
                        {
                            "seq": last_seq,
                            "token": fence.token if fence else None,
                            "scope": fence.scope if fence else None,
                        },
                    )
                self._conn.execute("COMMIT")
            except duckdb.ConstraintException:
                self._conn.execute("ROLLBACK")
                return False
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            finally:
                self._conn.unregister("kf_batch")
        _owner_only(self.path)  # a WAL made since (after a checkpoint) by the umask
        return True

    def _stored_ids(self, event_ids: Iterable[str]) -> set[str]:
        import pyarrow as pa

        ids = pa.table({"event_id": pa.array(list(event_ids), pa.string())})
        with self._lock:
            self._conn.register("kf_ids", ids)
            try:
                found = self._conn.execute(
                    "SELECT event_id FROM events WHERE event_id IN (SELECT event_id FROM kf_ids)"
                ).fetchall()
            finally:
                self._conn.unregister("kf_ids")
        return {row[0] for row in found}

    def read_raw(self, campaign_id: str | None = None, after_position: int = 0) -> Iterator[RawRow]:
        columns = "position, campaign_id, encode(payload), chain_hash, stream_seq"
        for batch in self._scan(columns, campaign_id, after_position):
            yield from map(RawRow._make, zip(*batch, strict=True))

    def read_payloads(
        self, campaign_id: str | None = None, after_position: int = 0
    ) -> Iterator[tuple[int, bytes]]:
        for positions, payloads in self._scan(
            "position, encode(payload)", campaign_id, after_position
        ):
            yield from zip(positions, payloads, strict=True)

    def replay_types(self, types: Sequence[str]) -> Iterator[tuple[int, Event]]:
        for positions, payloads in self._scan("position, encode(payload)", None, 0, types):
            for position, payload in zip(positions, payloads, strict=True):
                yield position, decode(payload)

    def _scan(
        self,
        columns: str,
        campaign_id: str | None,
        after_position: int,
        types: Sequence[str] = (),
    ) -> Iterator[list[list[Any]]]:
        """Column lists per Arrow batch, in position order."""
        sql = f"SELECT {columns} FROM events WHERE position > $after"
        params: dict[str, Any] = {"after": after_position}
        if campaign_id is not None:
            sql += " AND campaign_id = $campaign"
            params["campaign"] = campaign_id
        if types:
            sql += " AND list_contains($types, type)"
            params["types"] = list(types)
        cursor = self._conn.cursor()
        try:
            reader = cursor.sql(sql + " ORDER BY position", params=params).to_arrow_reader(100_000)
            for batch in reader:
                yield [column.to_pylist() for column in batch.columns]
        finally:
            cursor.close()

    def select_payloads(
        self,
        *,
        campaign_id: str | None = None,
        types: list[str] | None = None,
        problem: str | None = None,
        target: str | None = None,
        after_position: int = 0,
        limit: int = 10_000,
    ) -> list[tuple[int, bytes]]:
        """(position, payload) of matching events in position order: what actors replay."""
        where = ["position > $after"]
        params: dict[str, Any] = {"after": after_position, "limit": limit}
        if campaign_id is not None:
            where.append("campaign_id = $campaign")
            params["campaign"] = campaign_id
        if types:
            where.append("list_contains($types, type)")
            params["types"] = types
        if problem is not None:
            where.append("payload->>'problem' = $problem")
            params["problem"] = problem
        if target is not None:
            where.append("payload->>'target' = $target")
            params["target"] = target
        sql = (
            f"SELECT position, encode(payload) FROM events WHERE {' AND '.join(where)} "
            "ORDER BY position LIMIT $limit"
        )
        cursor = self._conn.cursor()
        try:
            rows = cursor.execute(sql, params).fetchall()
        finally:
            cursor.close()
        return [(int(position), bytes(payload)) for position, payload in rows]

    def query(
        self, sql: str, max_rows: int = 10_000, timeout: float = DEFAULT_QUERY_TIMEOUT
    ) -> QueryResult:
        """Run one read-only query (refused otherwise) on a cursor of its own, interrupted
        after `timeout` seconds; the transaction is always rolled back."""
        check_read_only(sql)
        cursor = self._conn.cursor()
        timer = threading.Timer(timeout, cursor.interrupt)
        self._queries.add(cursor)  # before the check: `close` sees it or it sees `close`
        if self._closing:
            self._queries.discard(cursor)
            cursor.close()
            raise duckdb.ConnectionException("the store is closing")
        try:
            cursor.execute("BEGIN TRANSACTION")
            timer.start()
            try:
                result = cursor.execute(sql)
                columns = [d[0] for d in result.description or []]
                types = [str(d[1]) for d in result.description or []]
                rows = result.fetchmany(max_rows + 1)
            except duckdb.InterruptException as exc:
                raise QueryTimeout(f"query timed out after {timeout:g} s") from exc
            finally:
                timer.cancel()
                with contextlib.suppress(duckdb.Error):  # closing the cursor discards it too
                    cursor.execute("ROLLBACK")
        finally:
            cursor.close()
            self._queries.discard(cursor)
        return QueryResult(
            columns=columns,
            types=types,
            rows=[list(r) for r in rows[:max_rows]],
            truncated=len(rows) > max_rows,
        )

    def close(self) -> None:
        """Interrupt the queries still running (a caller gone, a queue still full), wait
        for their threads to let go, then close."""
        self._closing = True
        for cursor in list(self._queries):
            with contextlib.suppress(duckdb.Error):
                cursor.interrupt()
        deadline = time.monotonic() + 10.0
        while self._queries and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._lock:
            self._conn.close()


def _to_arrow(rows: list[Row]) -> pa.Table:
    import pyarrow as pa

    events = [row.event for row in rows]
    actors = [e.actor for e in events]
    columns = [
        [row.position for row in rows],
        [e.event_id for e in events],
        [e.campaign_id for e in events],
        [type(e).__name__ for e in events],
        [e.schema for e in events],
        [e.ts for e in events],
        [a.role for a in actors],
        [a.instance for a in actors],
        [a.host for a in actors],
        [e.causation_id for e in events],
        [e.correlation_id for e in events],
        [row.stream_seq for row in rows],
        [row.payload.decode() for row in rows],
        [row.chain_hash for row in rows],
    ]
    return pa.Table.from_arrays(
        [
            pa.array(col, type=field.type)
            for col, field in zip(columns, _arrow_schema(), strict=True)
        ],
        schema=_arrow_schema(),
    )
