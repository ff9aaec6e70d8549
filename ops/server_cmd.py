"""`kfactory server`: the hub in the foreground."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import structlog
import typer

from bus.auth import AuthError, ClientAuth, TlsFiles
from ops.errors import UserError
from ops.home import resolve_home, running_server
from ops.hub import running_hub
from ops.lifecycle import run_command
from ops.options import CREDS, HOME, TLS_CA

log = structlog.get_logger("ops.server")


def register(app: typer.Typer) -> None:
    app.command(
        "server",
        help=(
            "Run the hub in the foreground: an embedded nats-server, the recorder that owns "
            "the DuckDB event store, and the read-only SQL service. Prints the NATS URL that "
            "actors on other hosts join with --nats.\n\n"
            "Every client authenticates: on first start each role (and hub, cli, admin) gets "
            "an nkey seed in HOME/creds (mode 0600), and each may publish and subscribe only "
            "what its role does. `kfactory creds ROLE -o FILE` copies one for another host. "
            "With --tls-cert and --tls-key clients must use TLS (give them the CA with "
            "--tls-ca).\n\n"
            "Examples:\n\n"
            "  kfactory server                            # 127.0.0.1, a port kept in HOME\n\n"
            "  kfactory server --listen 0.0.0.0 --port 4222 --tls-cert hub.pem "
            "--tls-key hub.key --tls-ca ca.pem   # a hub for other hosts\n\n"
            "  kfactory server --nats nats://n1:4222,nats://n2:4222   # record from a cluster"
        ),
    )(server)


def server(
    home: Path | None = HOME,
    listen: str = typer.Option("127.0.0.1", help="Address the embedded nats-server binds."),
    port: int = typer.Option(
        -1,
        help=(
            "Port of the embedded nats-server (-1: the one kept in HOME/nats/port, else a "
            "free one, then kept there so a restarted server keeps its URL)."
        ),
    ),
    nats: str | None = typer.Option(
        None, "--nats", help="Join this NATS (cluster) instead of embedding a server."
    ),
    tls_cert: Path | None = typer.Option(None, help="Server TLS certificate (PEM)."),
    tls_key: Path | None = typer.Option(None, help="Server TLS private key (PEM)."),
    tls_ca: Path | None = TLS_CA,
    no_auth: bool = typer.Option(
        False, "--no-auth", help="Let clients in without credentials (loopback only)."
    ),
    creds: Path | None = CREDS,
) -> None:
    folder = resolve_home(home)
    other = running_server(folder)
    if other is not None:
        raise UserError(f"a server (pid {other.pid}) already owns {folder}: {other.url}")
    if (tls_cert is None) != (tls_key is None):
        raise UserError("give both --tls-cert and --tls-key, or neither")
    tls = TlsFiles(tls_cert, tls_key) if tls_cert and tls_key else None
    for path in (tls_cert, tls_key, tls_ca, creds):
        if path is not None and not path.exists():
            raise UserError(f"no such file: {path}")
    external = ClientAuth(creds, tls_ca) if nats is not None else None
    try:
        run_command(
            lambda stop: _serve(
                stop, folder, nats, listen, port, not no_auth, tls, tls_ca, external
            ),
            stopped_status=0,  # a server's normal end is a signal: what it got is recorded
        )
    except AuthError as exc:
        raise UserError(str(exc)) from exc


async def _serve(
    stop: asyncio.Event,
    home: Path,
    nats_url: str | None,
    listen: str,
    port: int,
    auth: bool,
    tls: TlsFiles | None,
    ca_file: Path | None,
    external: ClientAuth | None,
) -> None:
    async with running_hub(
        home,
        nats_url=nats_url,
        listen=listen,
        port=port,
        auth=auth,
        tls=tls,
        ca_file=ca_file,
        external_auth=external,
        stop=stop,
    ) as hub:
        typer.echo(hub.url, err=False)  # stdout: a script reads the URL from here
        typer.echo(
            f"kfactory server: recording into {hub.store.path} "
            f"({hub.store.last_position} events)"
            + (f"; credentials in {home / 'creds'}" if auth and nats_url is None else "")
            + "; Ctrl-C stops",
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
