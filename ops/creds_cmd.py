"""`kfactory creds USER -o FILE`: hand one user's credentials to a process on another host."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from bus.auth import AuthError
from ops.accounts import USERS, export_seed
from ops.errors import UserError
from ops.home import resolve_home
from ops.options import HOME


def register(app: typer.Typer) -> None:
    app.command(
        "creds",
        help=(
            "Write USER's NATS credentials (an nkey seed, mode 0600) to FILE, for a process "
            "on another host: `kfactory actor ROLE --creds FILE`, or `kfactory run` / `sql` / "
            "`events tail --creds FILE` with the cli user. The hub creates every user's "
            "credentials in HOME/creds on its first start.\n\n"
            "Users: " + ", ".join(USERS) + ".\n\n"
            "Example:\n\n  kfactory creds verifier -o verifier.nk"
        ),
    )(creds)


def creds(
    user: str = typer.Argument(..., help="A role, or hub, cli, admin."),
    out: Path = typer.Option(
        ..., "--out", "-o", help="File to write (mode 0600), or - for stdout."
    ),
    home: Path | None = HOME,
) -> None:
    to_stdout = str(out) == "-"
    try:
        seed = export_seed(resolve_home(home), user, None if to_stdout else out)
    except AuthError as exc:
        raise UserError(str(exc)) from exc
    if to_stdout:
        sys.stdout.buffer.write(seed)
        sys.stdout.flush()
        return
    typer.echo(f"wrote {out} ({user}); keep it private", err=True)
