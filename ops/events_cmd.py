"""`kfactory events tail` and `kfactory events show`: the events, one line each.

Both read through the running server when there is one (live, over the bus), and
straight from the DuckDB file when none runs.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import typer

from bus.auth import AuthError, ClientAuth
from bus.connection import INTERACTIVE_WAIT, connect
from bus.follow import Msg, follow
from bus.subjects import SubjectError, campaign_filter, check_campaign_id, check_token
from eventstore.codec import InvalidEvent, decode
from eventstore.duckdb_store import DuckDBEventStore, QueryResult, QueryTimeout, StoreLocked
from eventstore.events import Event
from eventstore.queries import QueryFailed, StoreUnavailable, query
from ops.errors import UserError
from ops.home import client_auth_for, nats_url, resolve_home, store_path
from ops.lifecycle import run_command
from ops.options import CREDS, HOME, JSON, NATS, TLS_CA

events_app = typer.Typer(help="Read and watch the events.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(events_app, name="events")


@events_app.command(
    "tail",
    help=(
        "Print events as they are published, one line each, until Ctrl-C. With no server "
        "running, print the last events of the run folder's file instead (--limit, "
        "default 20) and stop.\n\n"
        "Examples:\n\n"
        "  kfactory events tail\n\n"
        "  kfactory events tail --campaign softmax-h200 --all --json"
    ),
)
def tail(
    campaign: str | None = typer.Option(None, help="Only this campaign's events."),
    from_start: bool = typer.Option(
        False, "--all", help="Start from the oldest event kept, not from now."
    ),
    limit: int = typer.Option(0, min=0, help="Stop after this many events (0: never)."),
    as_json: bool = JSON,
    home: Path | None = HOME,
    nats: str | None = NATS,
    creds: Path | None = CREDS,
    tls_ca: Path | None = TLS_CA,
) -> None:
    folder = resolve_home(home)
    url = nats_url(nats, folder)
    try:
        subject = campaign_filter(campaign)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    if url is None:
        rows = _select(folder, None, campaign, None, None if from_start else (limit or 20))
        _print_rows(rows, as_json)
        return
    try:
        auth = client_auth_for(folder, "cli", creds, tls_ca)
        run_command(lambda stop: _tail(stop, url, auth, subject, from_start, limit, as_json))
    except (ConnectionError, AuthError) as exc:
        raise UserError(str(exc)) from exc


@events_app.command(
    "show",
    help=(
        "Print stored events in order, one line each: from the running server, else "
        "straight from the run folder's DuckDB file.\n\n"
        "Examples:\n\n"
        "  kfactory events show --campaign softmax-demo\n\n"
        "  kfactory events show --type CampaignStalled --limit 5 --json"
    ),
)
def show(
    campaign: str | None = typer.Option(None, help="Only this campaign's events."),
    event_type: str | None = typer.Option(None, "--type", help="Only events of this type."),
    limit: int = typer.Option(50, min=0, help="The last this many events (0: all)."),
    as_json: bool = JSON,
    home: Path | None = HOME,
    nats: str | None = NATS,
    creds: Path | None = CREDS,
    tls_ca: Path | None = TLS_CA,
) -> None:
    folder = resolve_home(home)
    url = nats_url(nats, folder)
    auth = client_auth_for(folder, "cli", creds, tls_ca) if url is not None else None
    rows = _select(folder, url, campaign, event_type, limit or None, auth)
    _print_rows(rows, as_json)


def _select(
    home: Path,
    url: str | None,
    campaign: str | None,
    event_type: str | None,
    last: int | None,
    auth: ClientAuth | None = None,
) -> list[str]:
    """The payloads of the matching events, oldest first (only the `last` ones if given)."""
    where = []
    try:
        if campaign is not None:
            where.append(f"campaign_id = '{check_campaign_id(campaign)}'")
        if event_type is not None:
            where.append(f"type = '{check_token(event_type, 'event type')}'")
    except SubjectError as exc:
        raise UserError(str(exc)) from exc
    statement = (
        "SELECT payload FROM (SELECT position, payload FROM events"
        + (f" WHERE {' AND '.join(where)}" if where else "")
        + " ORDER BY position DESC"
        + (f" LIMIT {int(last)}" if last else "")
        + ") ORDER BY position"
    )
    max_rows = last or 10_000_000
    try:
        if url is not None:
            result = run_command(lambda stop: _over_bus(stop, url, auth, statement, max_rows))
        else:
            result = _on_file(store_path(home), statement, max_rows)
    except (QueryFailed, QueryTimeout, StoreLocked, StoreUnavailable) as exc:
        raise UserError(str(exc)) from exc
    except (ConnectionError, AuthError) as exc:
        raise UserError(str(exc)) from exc
    return [str(row[0]) for row in result.rows]


async def _over_bus(
    stop: asyncio.Event, url: str, auth: ClientAuth | None, statement: str, max_rows: int
) -> QueryResult:
    nc = await connect(
        url, "kfactory-events", wait_for_server=INTERACTIVE_WAIT, stop=stop, auth=auth
    )
    try:
        return await query(nc, statement, max_rows)
    finally:
        await nc.close()


def _on_file(path: Path, statement: str, max_rows: int) -> QueryResult:
    if not path.exists():
        raise UserError(
            f"no event store at {path} and no running server; run a campaign first, "
            "or pass --home/--nats"
        )
    store = DuckDBEventStore(path, read_only=True)
    try:
        return store.query(statement, max_rows)
    finally:
        store.close()


def _print_rows(payloads: list[str], as_json: bool) -> None:
    """One line per event; when none matched, `0 events` (on stderr with --json, whose
    stdout holds only events)."""
    for payload in payloads:
        print(payload if as_json else _line(payload.encode()))
    if not payloads:
        print("0 events", file=sys.stderr if as_json else sys.stdout)


async def _tail(
    stop: asyncio.Event,
    url: str,
    auth: ClientAuth,
    subject: str,
    from_start: bool,
    limit: int,
    as_json: bool,
) -> None:
    nc = await connect(url, "kfactory-tail", wait_for_server=INTERACTIVE_WAIT, stop=stop, auth=auth)
    seen = 0
    enough = asyncio.Event()

    async def show(message: Msg) -> None:
        nonlocal seen
        if stop.is_set() or enough.is_set():
            return
        text = message.data.decode("utf-8", "replace") if as_json else _line(message.data)
        print(text, flush=True)
        seen += 1
        if limit and seen >= limit:
            enough.set()

    try:
        subscription = await follow(nc, subject, show, new_only=not from_start)
        try:
            waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(enough.wait())}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waits:
                waiter.cancel()
        finally:
            await subscription.stop()
    finally:
        await nc.close()


def _line(data: bytes) -> str:
    try:
        event = decode(data)
    except InvalidEvent as exc:
        return f"{'-':12}  {'(invalid)':24}  {exc}"
    return (
        f"{event.ts:%H:%M:%S.%f}"[:12]
        + f"  {event.campaign_id:24}  {event.type:20}  {event.actor.role}/{event.actor.instance}"
        + f"  {_summary(event)}"
    )


def _summary(event: Event, width: int = 100) -> str:
    envelope = set(Event.__struct_fields__)
    fields = [f for f in event.__struct_fields__ if f not in envelope]
    text = " ".join(f"{f}={getattr(event, f)!r}" for f in fields)
    return text if len(text) <= width else text[: width - 3] + "..."
