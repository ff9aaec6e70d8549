"""`kfactory server`: the hub in the foreground.

It embeds a nats-server on `--listen` (127.0.0.1 by default) or joins `--nats` (a cluster:
URL1,URL2,URL3). Every client authenticates; `--no-auth` is refused off loopback. With
`--tls-cert` and `--tls-key` clients must use TLS and verify the hub with `--tls-ca`.

Recording has one owner at a time (`ops/hub.py`): a server that finds the recording
lease held waits as a standby until it expires (`--lease-ttl` s after the owner's last
renewal) or is released, then reads the stream from its own store's cursor. A server
that joined `--nats` (a cluster's) and is deposed (its lease lost, or its write fenced
out) stops recording, says so, and stands by again, so a cluster's only recorder comes
back by itself once the lease is free; a server with an embedded nats-server exits with
one line instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog
import typer

from bus.auth import AuthError, ClientAuth, TlsFiles
from bus.lease import LeaseLost
from eventstore.store import FencedOut
from ops.errors import UserError
from ops.home import resolve_home, running_server
from ops.hub import RECORDER_LEASE_TTL, Hub, running_hub
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
            "  kfactory server --nats nats://n1:4222,nats://n2:4222,nats://n3:4222 "
            "--creds hub.nk   # record from a cluster\n\n"
            "Recording has one owner at a time, through a lease in the NATS KV "
            "(KF_RECORDER_LEASE). A second server against the same NATS, with its own HOME "
            "and store, waits as a standby, and takes over when the owner's lease expires "
            "(--lease-ttl seconds after its last renewal), reading the stream from its own "
            "store's cursor. A recorder of a cluster that lost its lease writes nothing more "
            "and stands by again."
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
        None,
        "--nats",
        help="Join this NATS instead of embedding a server (a cluster: URL1,URL2,URL3).",
    ),
    lease_ttl: int = typer.Option(
        RECORDER_LEASE_TTL,
        "--lease-ttl",
        min=1,
        help="Seconds the recording lease lasts unrenewed: a standby takes over this long "
        "after the owner's last renewal.",
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
    if tls_cert is not None and tls_ca is None:
        raise UserError(
            "--tls-cert needs --tls-ca too: the CA that signed it, which the hub's own "
            "clients (recorder, store service) and every other host verify the server with"
        )
    tls = TlsFiles(tls_cert, tls_key) if tls_cert and tls_key else None
    for path in (tls_cert, tls_key, tls_ca, creds):
        if path is not None and not path.exists():
            raise UserError(f"no such file: {path}")
    external = ClientAuth(creds, tls_ca) if nats is not None else None
    try:
        run_command(
            lambda stop: _serve(
                stop,
                of_a_cluster=nats is not None,
                record=lambda: _record(
                    stop, folder, nats, listen, port, not no_auth, tls, tls_ca, external, lease_ttl
                ),
            ),
            stopped_status=0,  # a server's normal end is a signal: what it got is recorded
        )
    except AuthError as exc:
        raise UserError(str(exc)) from exc
    except (LeaseLost, FencedOut) as exc:
        raise UserError(f"recording stopped, this server was deposed: {exc}") from exc


async def _serve(
    stop: asyncio.Event, *, of_a_cluster: bool, record: Callable[[], Awaitable[None]]
) -> None:
    """Record; a server of a cluster that is deposed (its renewals went unanswered for a
    whole TTL, say while the cluster elected a leader) writes nothing more and stands by
    again, so a cluster with one recorder goes on recording once the lease is free."""
    while True:
        try:
            await record()
            return
        except (LeaseLost, FencedOut) as exc:
            if not of_a_cluster or stop.is_set():
                raise
            log.warning("deposed; standing by again", error=str(exc))
            typer.echo(f"kfactory server: deposed ({exc}); standing by again", err=True)


async def _record(
    stop: asyncio.Event,
    home: Path,
    nats_url: str | None,
    listen: str,
    port: int,
    auth: bool,
    tls: TlsFiles | None,
    ca_file: Path | None,
    external: ClientAuth | None,
    lease_ttl: int,
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
        lease_ttl=lease_ttl,
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
            await _until_anything_happens(hub, stop, 10)
            hub.check()  # raises LeaseLost or FencedOut once deposed: we stop recording
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


async def _until_anything_happens(hub: Hub, stop: asyncio.Event, timeout: float) -> None:
    """Wait for a stop, the recorder's end or the loss of the lease, at most `timeout` s."""
    waits = {asyncio.ensure_future(stop.wait()), hub.recording}
    if hub.lease is not None:
        waits.add(asyncio.ensure_future(hub.lease.lost.wait()))
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits - {hub.recording}:
            waiting.cancel()
