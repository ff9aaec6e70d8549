"""`kfactory events tail`: follow events live."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import typer

from bus.auth import ClientAuth
from bus.connection import connect
from bus.follow import Msg, follow
from bus.subjects import campaign_filter
from eventstore.codec import InvalidEvent, decode
from eventstore.events import Event
from ops.errors import UserError
from ops.home import client_auth_for, nats_url, resolve_home
from ops.options import CREDS, HOME, JSON, NATS, TLS_CA

events_app = typer.Typer(help="Watch the event stream.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(events_app, name="events")


@events_app.command(
    "tail",
    help=(
        "Print events as they are published, one line each, until Ctrl-C.\n\n"
        "Examples:\n\n"
        "  kfactory events tail\n\n"
        "  kfactory events tail --campaign softmax-h200 --all --json"
    ),
)
def tail(
    campaign: str | None = typer.Option(None, help="Only this campaign's events."),
    from_start: bool = typer.Option(
        False, "--all", help="Start from the oldest event kept in the stream, not from now."
    ),
    limit: int = typer.Option(0, help="Stop after this many events (0: never)."),
    as_json: bool = JSON,
    home: Path | None = HOME,
    nats: str | None = NATS,
    creds: Path | None = CREDS,
    tls_ca: Path | None = TLS_CA,
) -> None:
    folder = resolve_home(home)
    url = nats_url(nats, folder)
    if url is None:
        raise UserError("no running server found; pass --nats URL or start `kfactory server`")
    try:
        subject = campaign_filter(campaign)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    auth = client_auth_for(folder, "cli", creds, tls_ca)
    asyncio.run(_tail(url, auth, subject, from_start, limit, as_json))


async def _tail(
    url: str, auth: ClientAuth, subject: str, from_start: bool, limit: int, as_json: bool
) -> None:
    nc = await connect(url, "kfactory-tail", wait_for_server=5, auth=auth)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    seen = 0

    async def show(message: Msg) -> None:
        nonlocal seen
        if done.is_set():
            return
        print(_render(message, as_json), flush=True)
        seen += 1
        if limit and seen >= limit:
            done.set()

    subscription = await follow(nc, subject, show, new_only=not from_start)
    try:
        await done.wait()
    finally:
        await subscription.stop()
        await nc.close()


def _render(message: Msg, as_json: bool) -> str:
    if as_json:
        return message.data.decode("utf-8", "replace")
    try:
        event = decode(message.data)
    except InvalidEvent as exc:
        return f"{'-':12}  {'(invalid)':24}  {message.subject}  {exc}"
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
