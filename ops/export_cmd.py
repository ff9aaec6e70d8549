"""`kfactory export CAMPAIGN --parquet DIR`: the events and the projections as Parquet.

The store is never opened for writing: `export_parquet` attaches the run folder's store
file read-only to an in-memory DuckDB, creates the SQL views (`eventstore.views`) over it
as temporary views, and `COPY`s the campaign's rows of each to a Parquet file:
`events.parquet` (in store order) and one file per view in `VIEW_NAMES`. Like every
command that reads history, it says so and reads nothing while a server holds the file
(`ops/store_access.py`).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import typer

from eventstore.views import VIEW_NAMES, view_statements
from ops.errors import UserError
from ops.home import resolve_home, store_path
from ops.options import HOME, JSON
from ops.output import to_json
from ops.store_access import open_home

EXPORT_HELP = """Write a campaign's events and projections as Parquet files, for notebooks and other tools.

DIR receives events.parquet (one row per event: the store's columns, the payload JSON and the chain hash) and one file per view: candidates, leaderboard, lessons, rejections and steps (see the README for their columns).

Examples:

  kfactory export demo-softmax --parquet out/

  python -c "import pandas; print(pandas.read_parquet('out/leaderboard.parquet'))"

  duckdb -c "SELECT * FROM 'out/rejections.parquet'"
"""  # noqa: E501


def export(
    campaign: str = typer.Argument(..., help="The campaign id (its name)."),
    parquet: Path = typer.Option(..., "--parquet", help="Folder to write the files into."),
    home: Path | None = HOME,
    as_json: bool = JSON,
) -> None:
    with open_home(home) as snapshot:  # one-line errors for a missing or held store
        if campaign not in snapshot.campaign_ids():
            known = ", ".join(snapshot.campaign_ids()[:10]) or "none"
            raise UserError(f"no campaign {campaign!r} (campaigns: {known})")
    written = export_parquet(store_path(resolve_home(home)), campaign, parquet)
    if as_json:
        print(to_json(written))
        return
    for name, count in written.items():
        print(f"{parquet / (name + '.parquet')}: {count} rows")


def export_parquet(store: Path, campaign: str, folder: Path) -> dict[str, int]:
    """Write events and every view for one campaign; rows written per file."""
    folder.mkdir(parents=True, exist_ok=True)
    conn = duckdb.connect(":memory:")
    try:
        conn.execute(f"ATTACH '{_quoted(str(store))}' AS kf (READ_ONLY)")
        for statement in view_statements("kf.events", temporary=True):
            conn.execute(statement)
        written: dict[str, int] = {}
        for name in ("events", *VIEW_NAMES):
            source = "kf.events" if name == "events" else name
            query = f"SELECT * FROM {source} WHERE campaign_id = '{_quoted(campaign)}'"
            if name == "events":
                query += " ORDER BY position"
            target = folder / f"{name}.parquet"
            conn.execute(f"COPY ({query}) TO '{_quoted(str(target))}' (FORMAT parquet)")
            count = conn.execute(f"SELECT count(*) FROM ({query})").fetchone()
            written[name] = int(count[0]) if count else 0
        return written
    finally:
        conn.close()


def _quoted(text: str) -> str:
    return text.replace("'", "''")


def register(app: typer.Typer) -> None:
    app.command("export", help=EXPORT_HELP)(export)
