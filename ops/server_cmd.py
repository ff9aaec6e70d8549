"""`kfactory server`: the hub in the foreground."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import structlog
import typer

from ops.errors import UserError
from ops.home import resolve_home, running_server
from ops.hub import running_hub
from ops.options import HOME

log = structlog.get_logger("ops.server")


def register(app: typer.Typer) -> None:
    app.command(
        "server",
        help=(
            "Run the hub in the foreground: an embedded nats-server, the recorder that owns "
            "the DuckDB event store, and the read-only SQL service. Prints the NATS URL that "
            "actors on other hosts join with --nats.\n\n"
            "Examples:\n\n"
            "  kfactory server                                  # 127.0.0.1, random port\n\n"
            "  kfactory server --listen 0.0.0.0 --port 4222     # a hub for other hosts\n\n"
            "  kfactory server --nats nats://n1:4222,nats://n2:4222   # record from a cluster"
        ),
    )(server)


def server(
    home: Path | None = HOME,
    listen: str = typer.Option("127.0.0.1", help="Address the embedded nats-server binds."),
    port: int = typer.Option(-1, help="Port of the embedded nats-server (-1: a free one)."),
    nats: str | None = typer.Option(
        None, "--nats", help="Join this NATS (cluster) instead of embedding a server."
    ),
) -> None:
    folder = resolve_home(home)
    other = running_server(folder)
    if other is not None:
        raise UserError(f"a server (pid {other.pid}) already owns {folder}: {other.url}")
    asyncio.run(_serve(folder, nats, listen, port))


async def _serve(home: Path, nats_url: str | None, listen: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running_hub(home, nats_url=nats_url, listen=listen, port=port) as hub:
        typer.echo(hub.url, err=False)
        typer.echo(
            f"kfactory server: recording into {hub.store.path} "
            f"({hub.store.last_position} events); Ctrl-C stops",
            err=True,
        )
        last = -1
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 10)
            hub.check()
            if hub.store.last_position != last:
                last = hub.store.last_position
                stats = hub.recorder.stats
                log.info(
                    "recorder",
                    position=last,
                    rejected=stats.rejected,
                    dead_lettered=stats.dead_lettered,
                )
    typer.echo("kfactory server: stopped", err=True)
