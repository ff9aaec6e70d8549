"""`kfactory campaigns`: every campaign in the store; `campaigns diff A B` compares two."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from actors.campaign.history import HISTORY_TYPES
from actors.records.overview import diff, row
from actors.records.story import rebuild
from ops.errors import UserError
from ops.options import HOME, JSON
from ops.output import console, to_json
from ops.store_access import HistoryStore, open_history

campaigns_app = typer.Typer(
    name="campaigns",
    help=(
        "The campaigns in the store: problem, target, shapes, state, kernels evaluated, best "
        "time and speedup, start and wall time.\n\n"
        "Examples:\n\n"
        "  kfactory campaigns\n\n"
        "  kfactory campaigns --json\n\n"
        "  kfactory campaigns diff softmax-a softmax-b"
    ),
    invoke_without_command=True,
    no_args_is_help=False,
)


def _history(snapshot: HistoryStore) -> tuple[Any, dict[str, Any]]:
    events = list(snapshot.events(types=HISTORY_TYPES))
    ids = snapshot.campaign_ids()
    if not ids:
        raise UserError(f"no campaign in {snapshot.path}")
    history = rebuild(events, ids[0]).history
    return history, dict(snapshot.last_times())


@campaigns_app.callback()
def campaigns(
    ctx: typer.Context,
    home: Path | None = HOME,
    as_json: bool = JSON,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    with open_history(home) as snapshot:
        history, last = _history(snapshot)
    rows = [row(history, c, last.get(c)) for c in history.campaigns]
    if as_json:
        print(to_json(rows))
        return
    table = Table(title="campaigns")
    columns = (
        "campaign",
        "problem",
        "target",
        "shapes",
        "state",
        "evaluated",
        "best ms",
        "speedup",
        "started",
        "wall s",
    )
    for column in columns:
        table.add_column(column)
    for r in rows:
        table.add_row(
            r["campaign_id"],
            f"{r['problem']} ({r['dtype']})",
            r["target"],
            " ".join("x".join(map(str, s)) for s in r["shapes"]) or "default",
            r["state"].split(":")[0],
            str(r["evaluated"]),
            f"{r['best_ms']:.3f}" if r["best_ms"] is not None else "-",
            f"{r['best_speedup']:.2f}x" if r["best_speedup"] is not None else "-",
            r["started"][:16].replace("T", " "),
            f"{r['wall_seconds']:.0f}",
        )
    console().print(table)


@campaigns_app.command(
    "diff",
    help=(
        "Compare two campaigns of one problem: best kernel, evaluations to reach 95% of "
        "each one's best, rejections by stage, lessons by kind and those only one drew.\n\n"
        "Examples:\n\n"
        "  kfactory campaigns diff softmax-seed1 softmax-seed2\n\n"
        "  kfactory campaigns diff softmax-seed1 softmax-seed2 --json"
    ),
)
def campaigns_diff(
    a: str = typer.Argument(..., help="The first campaign."),
    b: str = typer.Argument(..., help="The second campaign."),
    home: Path | None = HOME,
    as_json: bool = JSON,
) -> None:
    with open_history(home) as snapshot:
        history, _ = _history(snapshot)
    for name in (a, b):
        if name not in history.campaigns:
            raise UserError(f"no campaign {name!r} (campaigns: {', '.join(history.campaigns)})")
    if a == b:
        raise UserError("give two different campaigns")
    pa, pb = history.campaigns[a].spec.problem, history.campaigns[b].spec.problem
    if pa != pb:
        raise UserError(f"{a} is a {pa} campaign and {b} a {pb} one: compare one problem")
    result = diff(history, a, b)
    if as_json:
        print(to_json(result))
        return
    table = Table(title=f"{a} vs {b} ({result['problem']})")
    for column in ("", a, b):
        table.add_column(column)
    for key, label in (
        ("best_candidate", "best"),
        ("best_speedup", "speedup"),
        ("best_ms", "median ms"),
        ("best_template", "template"),
        ("best_params", "parameters"),
        ("evaluated", "evaluated"),
        ("evaluations_to_95pct", "evaluations to 95% of best"),
        ("rejections", "rejections by stage"),
        ("lessons", "lessons by kind"),
    ):
        table.add_row(label, _cell(result["a"][key]), _cell(result["b"][key]))
    console().print(table)
    for side, name in (("lessons_only_in_a", a), ("lessons_only_in_b", b)):
        only = result[side]
        print(f"lessons only {name} drew: {len(only)}")
        for statement in only[:5]:
            print(f"  {statement}")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def register(app: typer.Typer) -> None:
    app.add_typer(campaigns_app, name="campaigns")
