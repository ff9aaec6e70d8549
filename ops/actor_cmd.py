"""`kfactory actor ROLE --nats URL`: one actor process, on any host."""

from __future__ import annotations

from pathlib import Path

import typer

from actors.roles.registry import ROLES
from actors.runtime import run_actor
from gpu_workers.targets import device_missing
from ops.errors import UserError
from ops.home import client_auth_for, nats_url, resolve_home
from ops.lifecycle import run_command
from ops.options import CREDS, HOME, NATS, TLS_CA
from ops.swarm import RUN_ON_THE_DEVICE, create_actor


def _roles_help() -> str:
    return "\n\n".join(f"  {role.name:14} {role.summary}" for role in ROLES.values())


def register(app: typer.Typer) -> None:
    app.command(
        "actor",
        help=(
            "Run one actor process that joins a hub over NATS. Instances of a role "
            "share the role's work; run as many as you like, on any host.\n\n"
            "Roles:\n\n" + _roles_help() + "\n\n"
            "On another host, give it the role's credentials (`kfactory creds ROLE -o FILE` "
            "on the hub) with --creds, and the hub's CA with --tls-ca when it uses TLS.\n\n"
            "Examples:\n\n  kfactory actor verifier --nats nats://hub:4222 --creds verifier.nk\n\n"
            "  kfactory actor compiler --target cuda --nats nats://hub:4222   (any host)\n\n"
            "  kfactory actor verifier --target cuda --nats nats://hub:4222   (a GPU host)"
        ),
    )(actor)


def actor(
    role: str = typer.Argument(..., help="One of: " + ", ".join(ROLES)),
    target: str = typer.Option(
        "cpu", help="The device target a verifier, benchmarker or compiler serves (cpu, cuda)."
    ),
    instance: str | None = typer.Option(None, help="Instance name (default: ROLE-PID)."),
    home: Path | None = HOME,
    nats: str | None = NATS,
    creds: Path | None = CREDS,
    tls_ca: Path | None = TLS_CA,
) -> None:
    spec = ROLES.get(role)
    if spec is None:
        raise UserError(f"unknown role {role!r}; choose one of: {', '.join(ROLES)}")
    if spec.targets is not None and target not in spec.targets:
        raise UserError(f"the {role} serves the targets {', '.join(spec.targets)}, not {target!r}")
    missing = device_missing(target, spec.name) if spec.name in RUN_ON_THE_DEVICE else None
    if missing is not None:
        raise UserError(f"a {role} for {target} needs the device here: {missing}")
    implementation = create_actor(spec, target)
    folder = resolve_home(home)
    url = nats_url(nats, folder)
    if url is None:
        raise UserError("no NATS URL: pass --nats nats://HOST:PORT (see `kfactory server`)")
    auth = client_auth_for(folder, role, creds, tls_ca)
    run_command(lambda stop: run_actor(implementation, url, instance, stop, auth))
