"""`kfactory bench`: benchmarks that print a table and JSON (never timed tests)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from ops.output import print_rows, to_json

bench_app = typer.Typer(help="Benchmarks: print a table, or one JSON object with --json.")


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench", no_args_is_help=True)


@bench_app.command(
    "store",
    help=(
        "Measure the event store on this machine: ingest through NATS into DuckDB, "
        "replay of 1,000,000 events, and SQL latency over request/reply.\n\n"
        "With --secure, ingest is measured again, in the same run, against a server that "
        "requires credentials, then one that requires credentials and TLS.\n\n"
        "Example:\n\n  kfactory bench store --events 200000 --secure --json"
    ),
)
def store(
    events: int = typer.Option(200_000, min=1000, help="Events to ingest through NATS."),
    replay_events: int = typer.Option(1_000_000, min=1000, help="Store size for replay and SQL."),
    sql_repeats: int = typer.Option(40, min=1, help="Rounds of the SQL query mix."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    workdir: Path | None = typer.Option(None, help="Where to put the temporary store."),
    secure: bool = typer.Option(
        False, "--secure", help="Also measure ingest with auth, and with auth and TLS (same run)."
    ),
) -> None:
    from ops.bench_store import run_store_benchmark

    progress = (lambda line: print(line, file=sys.stderr)) if as_json else print
    results = run_store_benchmark(
        events, replay_events, sql_repeats, workdir=workdir, report=progress, secure=secure
    )
    if as_json:
        print(to_json(results))
        return
    flat = [(k, f"{v:,.2f}") for k, v in results.items() if isinstance(v, int | float)]
    flat += [(f"  {k}", f"{v:,.2f}") for k, v in results["sql_p50_ms_by_query"].items()]
    print_rows(["figure", "value"], flat, "table", title="kfactory bench store")
