"""`kfactory ps`: the live actors, from their heartbeats, and the work queued per role."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from actors.roles.registry import ROLES
from actors.runtime import durable_name
from bus.auth import AuthError, ClientAuth
from bus.backlog import backlog
from bus.connection import INTERACTIVE_WAIT, connect
from bus.heartbeat import collect
from ops.errors import UserError
from ops.home import client_auth_for, nats_url, resolve_home
from ops.lifecycle import run_command
from ops.options import CREDS, HOME, JSON, NATS, TLS_CA
from ops.output import console, to_json

QUIET_S = 0.6
"""How long `ps` listens after the last new actor answered: each answers the ask at once."""


def register(app: typer.Typer) -> None:
    app.command(
        "ps",
        help=(
            "List the live actors from their heartbeats (role, instance, host, target, "
            "device, current job, state, last seen), and the work queued for each role.\n\n"
            "Examples:\n\n  kfactory ps\n\n  kfactory ps --nats nats://hub:4222 --json"
        ),
    )(ps)


def ps(
    wait: float = typer.Option(
        1.5,
        min=0.1,
        help="Seconds to listen for heartbeats at most (it stops once no new actor has "
        f"answered for {QUIET_S} s).",
    ),
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
        auth = client_auth_for(folder, "cli", creds, tls_ca)
        actors, queues = run_command(lambda stop: _look(stop, url, auth, wait))
    except (ConnectionError, AuthError) as exc:
        raise UserError(str(exc)) from exc
    if as_json:
        print(to_json({"actors": actors, "queues": queues}))
        return
    out = console()
    table = Table(title=f"live actors ({url})")
    columns = ("role", "instance", "host", "target", "device", "job", "state", "last seen")
    for column in columns:
        table.add_column(column, overflow="fold")
    for actor in actors:
        table.add_row(*(str(actor[c]) for c in columns[:-1]), f"{actor['last_seen_s']:.1f} s ago")
    out.print(table if actors else "no live actors")
    board = Table(title="work per role")
    for column in ("role", "consumer", "queued", "in flight", "instances", "idle"):
        board.add_column(column)
    for q in queues:
        board.add_row(
            q["role"],
            q["consumer"],
            str(q["queued"]),
            str(q["in_flight"]),
            str(q["instances"]),
            str(q["idle"]),
        )
    out.print(board)


async def _look(
    stop: asyncio.Event, url: str, auth: ClientAuth, wait: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nc = await connect(url, "kfactory-ps", wait_for_server=INTERACTIVE_WAIT, stop=stop, auth=auth)
    try:
        beats = await collect(nc, wait, quiet=QUIET_S)
        now = time.time()
        actors = [
            {
                "role": beat.role,
                "instance": beat.instance,
                "host": beat.host,
                "pid": beat.pid,
                "target": beat.target,
                "device": beat.device,
                "job": beat.job,
                "state": beat.state,
                "handled": beat.handled,
                "last_seen_s": round(max(now - received, 0.0), 1),
            }
            for beat, received in sorted(beats.values(), key=lambda b: (b[0].role, b[0].instance))
        ]
        queues = []
        for role in ROLES.values():
            for target in role.targets or (None,):
                found = await backlog(nc, durable_name(role.name, target))
                if found is None:
                    continue
                instances = [
                    a for a in actors if a["role"] == role.name and a["target"] == (target or "")
                ]
                queues.append(
                    {
                        "role": role.name,
                        "target": target or "",
                        "consumer": found.consumer,
                        "queued": found.queued,
                        "in_flight": found.in_flight,
                        "instances": len(instances),
                        "idle": found.waiting_instances,
                    }
                )
        return actors, queues
    finally:
        await nc.close()
