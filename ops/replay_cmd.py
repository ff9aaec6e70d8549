"""`kfactory replay CAMPAIGN`: the campaign's story, rebuilt from its events alone."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from actors.records.story import story
from ops.errors import UserError
from ops.options import HOME, JSON
from ops.output import console, to_json
from ops.store_access import open_history, rebuild_campaign

REPLAY_HELP = """Rebuild a campaign's state from its events alone and tell its story.

Prints the generations with the best kernel so far after each (the incumbent promoted head to head), the campaign's answer (rank 1: the final run's winner once there is one, and how it was decided), the lessons and what the proposals made after them did, the rejections by stage and reason (per generation), and the time each role spent (from each event's cause to the event, queueing included).

--at cuts the history: a number is a store position (see `kfactory sql "SELECT position, type FROM events"`), anything else an ISO time (UTC unless it names a zone).

Examples:

  kfactory replay demo-softmax

  kfactory replay demo-softmax --at 120

  kfactory replay demo-softmax --at 2026-12-01T15:02:00 --json

  kfactory replay demo-softmax --lessons 0
"""  # noqa: E501


def parse_at(text: str | None) -> tuple[int | None, datetime | None]:
    """A position (digits) or a moment (ISO 8601)."""
    if text is None:
        return None, None
    if text.strip().isdigit():
        return int(text), None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UserError(
            f"--at {text!r}: give a position (e.g. 120) or an ISO time (2026-12-01T15:02:00)"
        ) from None
    return None, moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def replay(
    campaign: str = typer.Argument(..., help="The campaign id (its name)."),
    at: str | None = typer.Option(
        None, "--at", help="State as of this store position or ISO time.", show_default=False
    ),
    lessons: int = typer.Option(20, "--lessons", min=0, help="Lessons to print (the latest)."),
    home: Path | None = HOME,
    as_json: bool = JSON,
) -> None:
    at_position, at_time = parse_at(at)
    with open_history(home) as snapshot:
        told = story(rebuild_campaign(snapshot, campaign, at_position, at_time))
    if as_json:
        print(to_json(told))
        return
    _print(told, lessons)


def _speed(best: dict[str, Any] | None) -> str:
    if best is None:
        return "-"
    return f"{best['speedup']:.2f}x {best['candidate_id']} ({best['median_ns'] / 1e6:.3f} ms)"


def _print(told: dict[str, Any], lessons: int) -> None:
    out = console()
    state = told["state"] + (f": {told['finish_reason']}" if told["finish_reason"] else "")
    out.print(
        f"[bold]{told['campaign_id']}[/]: {told['problem']} ({told['dtype']}) on "
        f"{told['target']}, shapes {told['shapes']}; {state}"
    )
    out.print(
        f"as of position {told['position']} ({told['as_of']}): {told['events']} events over "
        f"{told['wall_seconds']:.0f} s; {told['proposed']} proposed, {told['evaluated']} "
        f"evaluated, {told['duplicates_avoided']} duplicates avoided"
    )
    table = Table(title="generations")
    for column in ("gen", "proposed", "verified", "rejected", "dupes", "best here", "best so far"):
        table.add_column(column)
    for g in told["generations"]:
        table.add_row(
            str(g["generation"]) + ("" if g["closed"] else " (open)"),
            f"{g['proposed']}/{g['planned']}",
            str(g["verified"]),
            str(g["rejected"]),
            str(g["duplicates"]),
            _speed(g["best_in_generation"]),
            _speed(g["best_so_far"]),
        )
    out.print(table)
    if told["best"] is not None:
        out.print(f"best: {_speed(told['best'])}, decided by {told['best']['decided_by']}")
    shown = told["lessons"][-lessons:] if lessons else []
    if shown:
        out.print(f"[bold]lessons[/] ({len(shown)} of {len(told['lessons'])})")
        for lesson in shown:
            out.print(f"  g{lesson['generation']} {lesson['kind']}: {lesson['statement']}")
            out.print(f"      [dim]{lesson['changed']}[/]")
    if told["rejections"]:
        table = Table(title="rejections by stage and reason")
        for column in ("stage", "reason", "count", "by generation"):
            table.add_column(column)
        for r in told["rejections"]:
            per = ", ".join(f"g{g}: {n}" for g, n in r["by_generation"].items())
            table.add_row(r["stage"], r["reason"], str(r["count"]), per)
        out.print(table)
    else:
        out.print("rejections: none")
    table = Table(title="time per role (cause to event)")
    for column in ("role", "seconds", "events"):
        table.add_column(column)
    for a in told["actors"]:
        table.add_row(a["role"], f"{a['seconds']:.1f}", str(a["events"]))
    out.print(table)


def register(app: typer.Typer) -> None:
    app.command("replay", help=REPLAY_HELP)(replay)
