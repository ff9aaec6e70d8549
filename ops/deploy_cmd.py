"""`kfactory deploy CLUSTER.toml -o DIR`: the cluster's nats-server configurations."""

from __future__ import annotations

from pathlib import Path

import typer

from bus.auth import AuthError
from ops.deploy.render import SHIPPED, DeployError, load, render, write
from ops.errors import UserError
from ops.home import resolve_home
from ops.options import HOME


def register(app: typer.Typer) -> None:
    app.command(
        "deploy",
        help=(
            "Render the nats-server configuration of every node of a JetStream cluster, and "
            "of every GPU host's leaf node, from a cluster description (see "
            f"{SHIPPED.name} in ops/deploy/) and this run folder's credentials.\n\n"
            "Each node gets every user of the hub with the permissions of its role, TLS for "
            "clients, routes and leaf connections, and the description's sync_interval "
            "(shipped: always, every write fsynced before it is acknowledged). Each leaf "
            "node gets its own nkey (HOME/creds/leaf-NAME.nk), written into its "
            "configuration: the files are mode 0600. Missing credentials are created, as "
            "`kfactory server` does on its first start.\n\n"
            "Examples:\n\n"
            "  kfactory deploy ops/deploy/cluster.toml -o rendered/\n\n"
            "  scp rendered/n1.conf n1:/etc/kfactory/nats.conf   # and so on per node"
        ),
    )(deploy)


def deploy(
    description: Path = typer.Argument(..., help="The cluster description (TOML)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write the configurations to."),
    home: Path | None = HOME,
) -> None:
    try:
        deployment = load(description)
        written = write(render(deployment, resolve_home(home)), out)
    except (DeployError, AuthError) as exc:
        raise UserError(str(exc)) from exc
    for path in written:
        typer.echo(str(path))
    typer.echo(f"clients join with --nats {deployment.client_urls()}", err=True)
