"""Options several commands share, so they read the same everywhere."""

from __future__ import annotations

import typer

HOME = typer.Option(
    None,
    "--home",
    help=(
        "Run folder holding events.duckdb and the embedded NATS store "
        "(default: $KF_HOME or ./.kfactory)."
    ),
    show_default=False,
)
NATS = typer.Option(
    None,
    "--nats",
    help=(
        "NATS URL of a running server, e.g. nats://hub:4222 "
        "(default: $KF_NATS_URL, else the server of --home)."
    ),
    show_default=False,
)
JSON = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table.")
CREDS = typer.Option(
    None,
    "--creds",
    help=(
        "NATS nkey seed file from `kfactory creds` (default: $KF_CREDS, else the run "
        "folder's own credentials)."
    ),
    show_default=False,
)
TLS_CA = typer.Option(
    None,
    "--tls-ca",
    help=(
        "CA certificate that signed the hub's TLS certificate (default: $KF_TLS_CA, else "
        "the one the server of --home uses)."
    ),
    show_default=False,
)
