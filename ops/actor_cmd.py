"""`kfactory actor ROLE --nats URL`: one actor process, on any host."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from actors.roles import ROLES
from actors.runtime import run_actor
from ops.errors import UserError
from ops.home import nats_url, resolve_home
from ops.options import HOME, NATS


def _roles_help() -> str:
    return "\n\n".join(f"  {role.name:14} {role.summary}" for role in ROLES.values())


def register(app: typer.Typer) -> None:
    app.command(
        "actor",
        help=(
            "Run one actor process that joins a hub over NATS. Instances of a role "
            "share the role's work; run as many as you like, on any host.\n\n"
            "Roles:\n\n" + _roles_help() + "\n\n"
            "Example:\n\n  kfactory actor verifier --nats nats://hub:4222"
        ),
    )(actor)


def actor(
    role: str = typer.Argument(..., help="One of: " + ", ".join(ROLES)),
    instance: str | None = typer.Option(None, help="Instance name (default: ROLE-PID)."),
    home: Path | None = HOME,
    nats: str | None = NATS,
) -> None:
    spec = ROLES.get(role)
    if spec is None:
        raise UserError(f"unknown role {role!r}; choose one of: {', '.join(ROLES)}")
    implementation = spec.create()
    url = nats_url(nats, resolve_home(home))
    if url is None:
        raise UserError("no NATS URL: pass --nats nats://HOST:PORT (see `kfactory server`)")
    asyncio.run(run_actor(implementation, url, instance))
