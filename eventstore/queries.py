"""Read-only SQL over the store through its owner, on request/reply (`kf.svc.kf-store.*`)."""

from __future__ import annotations

import asyncio
from typing import Any

import duckdb
import msgspec
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.micro.service import Service

from bus.service import RequestRefused, ServiceError, request, serve
from eventstore.codec import decode
from eventstore.duckdb_store import DuckDBEventStore, QueryResult
from eventstore.events import Event
from eventstore.sql_guard import SqlRefused

SERVICE = "kf-store"


class SqlRequest(msgspec.Struct, frozen=True):
    sql: str
    max_rows: int = 10_000


class ReplayRequest(msgspec.Struct, frozen=True):
    campaign_id: str | None = None
    types: list[str] = []
    problem: str | None = None
    target: str | None = None
    after_position: int = 0
    limit: int = 5_000


class ReplayPage(msgspec.Struct, frozen=True):
    positions: list[int]
    payloads: list[msgspec.Raw]


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


async def serve_queries(nc: Client, store: DuckDBEventStore) -> Service:
    async def sql(data: bytes) -> bytes:
        try:
            ask = msgspec.json.decode(data, type=SqlRequest)
        except msgspec.DecodeError as exc:
            raise RequestRefused(f"bad request: {exc}") from exc
        try:
            result = await asyncio.to_thread(store.query, ask.sql, ask.max_rows)
        except SqlRefused as exc:
            raise RequestRefused(str(exc)) from exc
        except duckdb.Error as exc:
            raise RequestRefused(f"query failed: {exc}") from exc
        return _encoder.encode(result)

    async def replay_page(data: bytes) -> bytes:
        try:
            ask = msgspec.json.decode(data, type=ReplayRequest)
        except msgspec.DecodeError as exc:
            raise RequestRefused(f"bad request: {exc}") from exc
        rows = await asyncio.to_thread(
            store.select_payloads,
            campaign_id=ask.campaign_id,
            types=ask.types,
            problem=ask.problem,
            target=ask.target,
            after_position=ask.after_position,
            limit=min(ask.limit, 20_000),
        )
        return _encoder.encode(
            ReplayPage([p for p, _ in rows], [msgspec.Raw(payload) for _, payload in rows])
        )

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
        {"sql": sql, "status": status, "replay": replay_page},
        description="read-only SQL over the Kernel Factory event store",
    )


async def query(nc: Client, sql: str, max_rows: int = 10_000, timeout: float = 30.0) -> QueryResult:
    """Ask the store owner; SqlRefused for anything but one read-only query."""
    try:
        reply = await request(
            nc, SERVICE, "sql", msgspec.json.encode(SqlRequest(sql, max_rows)), timeout
        )
    except ServiceError as exc:
        if exc.code == 400:
            raise SqlRefused(str(exc)) from exc
        raise
    except (NoRespondersError, NatsTimeout) as exc:
        raise StoreUnavailable(
            "no event store answered on the bus (is `kfactory server` running?)"
        ) from exc
    return msgspec.json.decode(reply, type=QueryResult)


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
        except (NoRespondersError, NatsTimeout) as exc:
            raise StoreUnavailable("no event store answered on the bus") from exc
        page = msgspec.json.decode(reply, type=ReplayPage)
        found += [
            (p, decode(bytes(raw))) for p, raw in zip(page.positions, page.payloads, strict=True)
        ]
        if len(page.positions) < ask.limit:
            return found
        after_position = page.positions[-1]


async def status(nc: Client, timeout: float = 5.0) -> StoreStatus:
    try:
        reply = await request(nc, SERVICE, "status", b"", timeout)
    except (NoRespondersError, NatsTimeout) as exc:
        raise StoreUnavailable("no event store answered on the bus") from exc
    return msgspec.json.decode(reply, type=StoreStatus)
