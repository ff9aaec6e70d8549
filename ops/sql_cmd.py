"""`kfactory sql`: read-only SQL over the event store."""

from __future__ import annotations

import asyncio
import sys
from enum import StrEnum
from pathlib import Path

import typer

from bus.auth import AuthError, ClientAuth
from bus.connection import INTERACTIVE_WAIT, connect
from eventstore.duckdb_store import (
    DEFAULT_QUERY_TIMEOUT,
    DuckDBEventStore,
    QueryResult,
    QueryTimeout,
    StoreLocked,
)
from eventstore.queries import QueryFailed, StoreUnavailable, query
from eventstore.sql_guard import SqlRefused
from ops.errors import UserError
from ops.home import client_auth_for, nats_url, resolve_home, store_path
from ops.lifecycle import run_command
from ops.options import CREDS, HOME, NATS, TLS_CA
from ops.output import print_rows


class Format(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def register(app: typer.Typer) -> None:
    app.command(
        "sql",
        help=(
            "Run one read-only query (a single SELECT or WITH) over the events table. "
            "Goes through the running server when there is one, else opens the file "
            "read-only. Anything that writes is refused.\n\n"
            "Columns: position, event_id, campaign_id, type, schema, ts, actor_role, "
            "actor_instance, actor_host, causation_id, correlation_id, stream_seq, "
            "payload (the event as JSON text), chain_hash.\n\n"
            "Views that need no knowledge of the payload: candidates (one row per candidate "
            "through every stage), leaderboard, lessons, rejections, steps (seconds from "
            "each event's cause, per role).\n\n"
            "Examples:\n\n"
            '  kfactory sql "SELECT type, count(*) FROM events GROUP BY type"\n\n'
            "  kfactory sql \"SELECT payload->>'reason' AS reason FROM events "
            "WHERE type = 'EventRejected'\" --format csv\n\n"
            '  kfactory sql "SELECT * FROM leaderboard WHERE rank <= 3"'
        ),
    )(sql)


def sql(
    statement: str = typer.Argument(..., metavar="SQL", help="One SELECT or WITH query."),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    max_rows: int = typer.Option(10_000, min=1, help="Return at most this many rows."),
    timeout: float = typer.Option(
        DEFAULT_QUERY_TIMEOUT, min=0.1, help="Seconds the query may run before it is stopped."
    ),
    home: Path | None = HOME,
    nats: str | None = NATS,
    creds: Path | None = CREDS,
    tls_ca: Path | None = TLS_CA,
) -> None:
    folder = resolve_home(home)
    url = nats_url(nats, folder)
    try:
        if url is not None:
            auth = client_auth_for(folder, "cli", creds, tls_ca)
            result = run_command(
                lambda stop: _over_bus(stop, url, statement, max_rows, timeout, auth)
            )
        else:
            result = _on_file(store_path(folder), statement, max_rows, timeout)
    except SqlRefused as exc:
        raise UserError(f"refused: {exc}") from exc
    except (QueryFailed, QueryTimeout) as exc:
        raise UserError(str(exc)) from exc
    except (StoreLocked, StoreUnavailable, FileNotFoundError, ConnectionError, AuthError) as exc:
        raise UserError(str(exc)) from exc
    print_rows(result.columns, result.rows, fmt.value)
    if result.truncated:
        print(f"kfactory sql: output cut at {max_rows} rows (--max-rows)", file=sys.stderr)


async def _over_bus(
    stop: asyncio.Event, url: str, statement: str, max_rows: int, timeout: float, auth: ClientAuth
) -> QueryResult:
    nc = await connect(url, "kfactory-sql", wait_for_server=INTERACTIVE_WAIT, stop=stop, auth=auth)
    try:
        return await query(nc, statement, max_rows, timeout)
    finally:
        await nc.close()


def _on_file(path: Path, statement: str, max_rows: int, timeout: float) -> QueryResult:
    if not path.exists():
        raise FileNotFoundError(
            f"no event store at {path} and no running server; start one with `kfactory server` "
            "or `kfactory run`, or pass --home/--nats"
        )
    store = DuckDBEventStore(path, read_only=True)
    try:
        return store.query(statement, max_rows, timeout)
    finally:
        store.close()
