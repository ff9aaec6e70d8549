"""`kfactory lessons`: the lessons a campaign recorded, as its librarian drew them."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from eventstore.events import LessonLearned
from ops.errors import UserError
from ops.options import HOME, JSON
from ops.output import console, to_json
from ops.store_access import open_home

LESSONS_HELP = (
    "The lessons a campaign recorded, oldest first: parameter effects, failures, avoided "
    "regions, what each variation operator paid on the problem's family (kind operator), "
    "and the best's lineage; each with how sure it is. --latest keeps each lesson's last "
    "word (one per kind and subject).\n\n"
    "Examples:\n\n"
    "  kfactory lessons demo-softmax\n\n"
    "  kfactory lessons my-evolve --kind operator --latest\n\n"
    "  kfactory lessons my-evolve --json"
)


def _subject(lesson: LessonLearned) -> tuple[str, ...]:
    """What a lesson speaks of (its kind, and the operator, template, parameter value,
    host or rejection it names; not its figures): later lessons of it supersede it."""
    keys = ("operator", "template", "param", "value", "device", "stage", "reason", "signature")
    named = [lesson.data.get(key) for key in keys]
    return (lesson.kind, *(repr(x) for x in named if not isinstance(x, dict)))


def lessons(
    campaign: str = typer.Argument(..., help="The campaign id (its name)."),
    kind: list[str] = typer.Option(
        [], "--kind", help="Only lessons of this kind (repeatable): operator, lineage..."
    ),
    latest: bool = typer.Option(
        False, "--latest", help="Only each subject's latest lesson (per kind and subject)."
    ),
    home: Path | None = HOME,
    as_json: bool = JSON,
) -> None:
    with open_home(home) as snapshot:
        if campaign not in snapshot.campaign_ids():
            raise UserError(f"no campaign {campaign!r} in {snapshot.path}")
        told = [
            event
            for _, event in snapshot.events(campaign, ["LessonLearned"])
            if isinstance(event, LessonLearned) and (not kind or event.kind in kind)
        ]
    if latest:
        told = list({_subject(x): x for x in told}.values())
    if as_json:
        rows = [
            {
                "generation": x.generation,
                "kind": x.kind,
                "statement": x.statement,
                "evidence_ids": x.evidence_ids,
                "data": x.data,
            }
            for x in told
        ]
        print(to_json(rows))
        return
    out = console()
    if not told:
        out.print(f"no lesson recorded for {campaign}" + (f" of kind {kind}" if kind else ""))
    for x in told:
        line = f"g{x.generation} [bold]{x.kind}[/]: {escape(x.statement)}"
        out.print(line, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("lessons", help=LESSONS_HELP)(lessons)
