"""Read-only SQL over the store through its owner, on request/reply (`kf.svc.kf-store.*`).

Queries run concurrently, each on a cursor of its own with a time limit. A result too big
for one message (NATS caps them at 1 MiB) is cut into pages the caller fetches in turn
(`sql-page`), so only the row cap, which the caller sets, limits it.

The `kf-store` micro service has five endpoints:
- `sql`: `SqlRequest` (one read-only statement, `max_rows` 10,000, `timeout`
  `DEFAULT_QUERY_TIMEOUT` unless the caller says; the server caps both at
  `MAX_ROWS` and `MAX_QUERY_TIMEOUT`, which a caller can lower, never raise); the first
  `SqlPage` of the result;
- `sql-page`: the next pages, `PAGE_BYTES` (640 KiB) each, kept `PAGES_KEPT_FOR` (120 s)
  and at most `PAGES_KEPT_BYTES` (64 MiB) in all (the oldest results dropped first);
- `status`: the store's path, last position, campaign count and stream cursor;
- `recorded`: whether the message of an event id at a stream sequence was stored, refused
  (the recorder went past it without storing it: `causality.py`'s rule) or is pending;
- `replay`: stored payloads in position order, filtered by campaign, event types,
  problem, target and position (what `History` is rebuilt from). A page is bounded in
  bytes (`REPLAY_PAGE_BYTES`, 768 KiB of payloads, but at least one event, each at most
  512 KiB) as well as in count, and says whether `more` follows: however big the stored
  events (a flood of junk's rejections), no reply passes NATS's 1 MiB.
Each request is answered in a task of its own and runs the store in a thread of the
service's own bounded pools (`QUERY_WORKERS` for SQL, `REPLAY_WORKERS` for replay), never
in the default executor the recorder's appends run in: however many slow queries are
asked at once, they queue in their pool and the recorder's writes never wait on one. The
pools are shared fairly among askers (`fair_pool.py`; the asker is the user whose inbox
the reply goes to, `bus.service.asker`): one asker runs at most
`QUERY_WORKERS_PER_ASKER` (2) queries and `REPLAY_WORKERS_PER_ASKER` (1) replay page at a
time, and waiting requests take turns across askers, so one role's slow queries never
make another's wait for them. The roles that never read history (the verifier, the
compiler, the fuser: `authority.NO_STORE_READS`), and a request whose reply goes to no
known user's inbox, are refused SQL and replay (403). A
refused query answers code 400, a timeout 408, a failed query 422; `StoreUnavailable`
when no owner answers.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Mapping
from typing import Any

import duckdb
import msgspec

from bus.connection import Client
from bus.service import (
    NoAnswer,
    NoResponder,
    RequestRefused,
    Service,
    ServiceError,
    asked,
    asker,
    request,
    serve,
)
from eventstore.authority import NO_STORE_READS
from eventstore.codec import decode
from eventstore.duckdb_store import (
    DEFAULT_QUERY_TIMEOUT,
    DuckDBEventStore,
    QueryResult,
    QueryTimeout,
)
from eventstore.events import Event
from eventstore.fair_pool import FairPool
from eventstore.sql_guard import SqlRefused

SERVICE = "kf-store"
#: Who asked, when the reply goes to no known user's inbox.
UNKNOWN_ASKER = "unknown user"


#: Bytes of result per reply: under NATS's 1 MiB message cap once base64-encoded.
PAGE_BYTES = 640 * 1024
#: Seconds a paged result waits for its caller to fetch the rest.
PAGES_KEPT_FOR = 120.0
#: Bytes of unfetched pages kept in all; past it the oldest results are dropped.
PAGES_KEPT_BYTES = 64 * 1024 * 1024
#: Payload bytes per replay reply (the reply's framing adds little: under 1 MiB).
REPLAY_PAGE_BYTES = 768 * 1024
#: Rows read from the store at a time while a replay page fills.
_REPLAY_BATCH = 200
#: Threads answering SQL, and replay, at once; more requests queue for them. One asker
#: (a role's user) runs at most `..._PER_ASKER` of them: the rest are others' turn.
QUERY_WORKERS = 4
QUERY_WORKERS_PER_ASKER = 2
REPLAY_WORKERS = 2
REPLAY_WORKERS_PER_ASKER = 1
#: The server's caps on a query: a caller may ask for less, never more.
MAX_QUERY_TIMEOUT = DEFAULT_QUERY_TIMEOUT
MAX_ROWS = 100_000


class SqlRequest(msgspec.Struct, frozen=True):
    sql: str
    max_rows: int = 10_000
    timeout: float = DEFAULT_QUERY_TIMEOUT


class SqlPage(msgspec.Struct, frozen=True):
    """One page of an encoded QueryResult; `result_id` names the rest."""

    result_id: str
    index: int
    count: int
    chunk: bytes


class PageRequest(msgspec.Struct, frozen=True):
    result_id: str
    index: int


class QueryFailed(RuntimeError):
    """The store ran the query and it failed (a timeout, a bad column, ...)."""


class ReplayRequest(msgspec.Struct, frozen=True):
    campaign_id: str | None = None
    types: list[str] = []
    problem: str | None = None
    target: str | None = None
    after_position: int = 0
    limit: int = 5_000


class RecordedRequest(msgspec.Struct, frozen=True):
    event_id: str
    stream_seq: int


class RecordedState(msgspec.Struct, frozen=True):
    """`stored`; `refused` (the recorder took the stream past it and did not store it);
    or `pending` (not taken yet)."""

    state: str


def _recorded(store: DuckDBEventStore, ask: RecordedRequest) -> RecordedState:
    cursor = store.stream_cursor  # read first: a batch stores its events with its cursor
    if store.holds(ask.event_id):
        return RecordedState("stored")
    return RecordedState("refused" if cursor >= ask.stream_seq else "pending")


class ReplayPage(msgspec.Struct, frozen=True):
    positions: list[int]
    payloads: list[msgspec.Raw]
    more: bool = False


def capped(ask: SqlRequest) -> tuple[int, float]:
    """The rows and seconds a query gets: what the caller asked, within the server's caps
    (a bound that is not a positive number gets the cap)."""
    rows = ask.max_rows if 0 < ask.max_rows <= MAX_ROWS else MAX_ROWS
    timeout = ask.timeout if 0 < ask.timeout <= MAX_QUERY_TIMEOUT else MAX_QUERY_TIMEOUT
    return rows, timeout


class StoreStatus(msgspec.Struct, frozen=True):
    path: str
    last_position: int
    campaigns: int
    stream_cursor: int


class StoreUnavailable(RuntimeError):
    """No store owner answered on the bus."""


def _encode_value(value: Any) -> Any:
    return str(value)


_encoder = msgspec.json.Encoder(enc_hook=_encode_value)


class _Pages:
    """Encoded results waiting to be fetched page by page."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[float, list[bytes]]] = {}

    def first(self, encoded: bytes) -> SqlPage:
        now = time.monotonic()
        for key in [k for k, (until, _) in self._kept.items() if until < now]:
            del self._kept[key]
        chunks = [encoded[i : i + PAGE_BYTES] for i in range(0, len(encoded), PAGE_BYTES)]
        result_id = uuid.uuid4().hex
        if len(chunks) > 1:
            self._kept[result_id] = (now + PAGES_KEPT_FOR, chunks)
            self._bound()
        return SqlPage(result_id, 0, len(chunks), chunks[0] if chunks else b"")

    def kept_bytes(self) -> int:
        return sum(len(chunk) for _, chunks in self._kept.values() for chunk in chunks[1:])

    def _bound(self) -> None:
        """Drop the oldest unfetched results until the rest fit `PAGES_KEPT_BYTES`."""
        while len(self._kept) > 1 and self.kept_bytes() > PAGES_KEPT_BYTES:
            del self._kept[next(iter(self._kept))]

    def page(self, ask: PageRequest) -> SqlPage:
        kept = self._kept.get(ask.result_id)
        if kept is None or not 0 < ask.index < len(kept[1]):
            raise RequestRefused(f"no page {ask.index} of result {ask.result_id} (expired?)")
        chunks = kept[1]
        if ask.index == len(chunks) - 1:
            del self._kept[ask.result_id]
        return SqlPage(ask.result_id, ask.index, len(chunks), chunks[ask.index])


def _replay_page(store: DuckDBEventStore, ask: ReplayRequest) -> ReplayPage:
    """Up to `ask.limit` events after `ask.after_position`, cut at `REPLAY_PAGE_BYTES`."""
    positions: list[int] = []
    payloads: list[msgspec.Raw] = []
    size, after, limit = 0, ask.after_position, max(1, min(ask.limit, 20_000))
    while len(positions) < limit:
        batch = min(_REPLAY_BATCH, limit - len(positions))
        rows = store.select_payloads(
            campaign_id=ask.campaign_id,
            types=ask.types,
            problem=ask.problem,
            target=ask.target,
            after_position=after,
            limit=batch,
        )
        for position, payload in rows:
            if positions and size + len(payload) > REPLAY_PAGE_BYTES:
                return ReplayPage(positions, payloads, more=True)
            positions.append(position)
            payloads.append(msgspec.Raw(payload))
            size += len(payload)
        if len(rows) < batch:
            return ReplayPage(positions, payloads, more=False)
        after = positions[-1]
    return ReplayPage(positions, payloads, more=True)


async def serve_queries(
    nc: Client, store: DuckDBEventStore, askers: Mapping[str, str] | None = None
) -> Service:
    """Serve the store. `askers` maps the users' public keys to their names: each is a
    principal the pools are shared fairly among, and a request whose reply goes to no
    known user's inbox is one more principal, whoever sent it. Without `askers` (no
    authentication), each connection's inbox is its own principal."""
    pages = _Pages()
    queries = FairPool(QUERY_WORKERS, QUERY_WORKERS_PER_ASKER, "kf-sql")
    replays = FairPool(REPLAY_WORKERS, REPLAY_WORKERS_PER_ASKER, "kf-replay")

    def principal() -> str:
        return asker() if askers is None else askers.get(asker(), UNKNOWN_ASKER)

    def reader() -> str:
        """The asker, if it may read the store (RequestRefused, 403, if not)."""
        who = principal()
        if askers is not None and (who in NO_STORE_READS or who == UNKNOWN_ASKER):
            raise RequestRefused(f"the {who} may not read the store", code=403)
        return who

    async def sql(data: bytes) -> bytes:
        ask = asked(data, SqlRequest)
        max_rows, timeout = capped(ask)
        try:
            result = await queries.run(
                reader(), functools.partial(store.query, ask.sql, max_rows, timeout)
            )
        except SqlRefused as exc:
            raise RequestRefused(str(exc)) from exc
        except QueryTimeout as exc:
            raise RequestRefused(str(exc), code=408) from exc
        except duckdb.Error as exc:
            raise RequestRefused(f"query failed: {exc}", code=422) from exc
        return _encoder.encode(pages.first(_encoder.encode(result)))

    async def sql_page(data: bytes) -> bytes:
        ask = asked(data, PageRequest)
        return _encoder.encode(pages.page(ask))

    async def replay_page(data: bytes) -> bytes:
        ask = asked(data, ReplayRequest)
        page = await replays.run(reader(), functools.partial(_replay_page, store, ask))
        return _encoder.encode(page)

    async def recorded_state(data: bytes) -> bytes:
        ask = asked(data, RecordedRequest)
        answer = await replays.run(principal(), functools.partial(_recorded, store, ask))
        return _encoder.encode(answer)

    async def status(_: bytes) -> bytes:
        return _encoder.encode(
            StoreStatus(
                path=str(store.path),
                last_position=store.last_position,
                campaigns=len(store.campaign_heads()),
                stream_cursor=store.stream_cursor,
            )
        )

    return await serve(
        nc,
        SERVICE,
        "1.0.0",
        {
            "sql": sql,
            "sql-page": sql_page,
            "status": status,
            "replay": replay_page,
            "recorded": recorded_state,
        },
        description="read-only SQL over the Kernel Factory event store",
    )


async def query(
    nc: Client, sql: str, max_rows: int = 10_000, timeout: float = DEFAULT_QUERY_TIMEOUT
) -> QueryResult:
    """Ask the store owner; SqlRefused for anything but one read-only query, QueryFailed
    when it ran and failed (a timeout says so)."""
    wait = timeout + 10.0  # the store interrupts the query first and says so
    first = await _ask(nc, "sql", msgspec.json.encode(SqlRequest(sql, max_rows, timeout)), wait)
    chunks = [first.chunk]
    for index in range(1, first.count):
        ask = msgspec.json.encode(PageRequest(first.result_id, index))
        chunks.append((await _ask(nc, "sql-page", ask, wait)).chunk)
    return msgspec.json.decode(b"".join(chunks), type=QueryResult)


async def _ask(nc: Client, endpoint: str, data: bytes, timeout: float) -> SqlPage:
    try:
        reply = await request(nc, SERVICE, endpoint, data, timeout)
    except ServiceError as exc:
        if exc.code == 400:
            raise SqlRefused(str(exc)) from exc
        raise QueryFailed(str(exc)) from exc
    except NoResponder as exc:
        raise StoreUnavailable(
            "no event store answered on the bus (is `kfactory server` running?)"
        ) from exc
    except NoAnswer as exc:
        raise StoreUnavailable(f"the event store did not answer within {timeout:g} s") from exc
    return msgspec.json.decode(reply, type=SqlPage)


async def replay(
    nc: Client,
    *,
    campaign_id: str | None = None,
    types: list[str] | None = None,
    problem: str | None = None,
    target: str | None = None,
    after_position: int = 0,
    timeout: float = 30.0,
) -> list[tuple[int, Event]]:
    """Stored events matching the filters, in position order, from the store's owner."""
    found: list[tuple[int, Event]] = []
    while True:
        ask = ReplayRequest(campaign_id, types or [], problem, target, after_position)
        try:
            reply = await request(nc, SERVICE, "replay", msgspec.json.encode(ask), timeout)
        except (NoResponder, NoAnswer) as exc:
            raise StoreUnavailable("no event store answered on the bus") from exc
        page = msgspec.json.decode(reply, type=ReplayPage)
        found += [
            (p, decode(bytes(raw))) for p, raw in zip(page.positions, page.payloads, strict=True)
        ]
        if not page.more or not page.positions:
            return found
        after_position = page.positions[-1]


async def recorded(nc: Client, event_id: str, stream_seq: int, timeout: float = 10.0) -> str:
    """`stored`, `refused` or `pending`: what the recorder did with the message of
    `event_id` at `stream_seq` on KF_EVENTS."""
    ask = msgspec.json.encode(RecordedRequest(event_id, stream_seq))
    try:
        reply = await request(nc, SERVICE, "recorded", ask, timeout)
    except (NoResponder, NoAnswer) as exc:
        raise StoreUnavailable("no event store answered on the bus") from exc
    return msgspec.json.decode(reply, type=RecordedState).state


async def stored_or_refused(nc: Client, event_id: str, stream_seq: int, wait: float) -> bool:
    """Wait until the recorder took the message of `event_id` at `stream_seq`: True if it
    stored it, False if it refused it; TimeoutError if it did neither within `wait` s."""
    deadline = time.monotonic() + wait
    while True:
        state = await recorded(nc, event_id, stream_seq)
        if state != "pending":
            return state == "stored"
        if time.monotonic() > deadline:
            raise TimeoutError(f"event {event_id} is not recorded yet")
        await asyncio.sleep(0.05)


async def status(nc: Client, timeout: float = 5.0) -> StoreStatus:
    try:
        reply = await request(nc, SERVICE, "status", b"", timeout)
    except (NoResponder, NoAnswer) as exc:
        raise StoreUnavailable("no event store answered on the bus") from exc
    return msgspec.json.decode(reply, type=StoreStatus)
