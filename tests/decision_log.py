"""Recorded event logs for the actors' decision tests: a real campaign's events, in
store order, one JSON event a line (the way Kernel Tuner tests its strategies from a
recorded cache instead of a device).

Record one from a campaign's home: `python -m tests.decision_log HOME CAMPAIGN_ID OUT`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import duckdb

from actors.campaign.history import HISTORY_TYPES, History
from eventstore.codec import decode
from eventstore.events import Event
from kernels.design_space import Param, Params, ParamValue, Template

LOGS = Path(__file__).parent / "logs"


def read_log(name: str) -> list[Event]:
    lines = (LOGS / name).read_text().splitlines()
    return [decode(line.encode()) for line in lines if line.strip()]


class AsRecorded:
    """A space as a recorded swarm searched it: without the parameters added since (those
    with a `before` value), which its points take at that value (`Template.completed`),
    without the choices added since (`Param.added`), and discarding a point whose
    structures fix values it does not hold (before `Template.canonical`); everything else
    is the space's own."""

    def __init__(self, space: Template) -> None:
        self._space = space

    @property
    def params(self) -> tuple[Param, ...]:
        return tuple(
            dataclasses.replace(p, choices=tuple(c for c in p.choices if c not in p.added))
            for p in self._space.params
            if p.before is None
        )

    def completed(self, params: Params) -> dict[str, ParamValue]:
        return dict(params)  # the search sees the points as recorded; render completes them

    def canonical(self, params: Params) -> dict[str, ParamValue]:
        return dict(params)  # the recorded search discarded a point its structures fix

    def __getattr__(self, name: str) -> Any:
        return getattr(self._space, name)


def as_recorded(space: Template) -> Template:
    return cast(Template, AsRecorded(space))


def replay(events: list[Event]) -> Iterator[tuple[History, Event]]:
    """Each event with the history as it stood once that event was applied (a consumer
    may apply its own reactions to the history in between)."""
    history = History()
    for event in events:
        history.apply(history.position + 1, event)
        yield history, event


def record(home: Path, campaign_id: str, out: Path) -> int:
    conn = duckdb.connect(str(home / "events.duckdb"), read_only=True)
    try:
        rows = conn.execute(
            "SELECT payload FROM events WHERE campaign_id = ? AND type IN "
            f"({', '.join('?' * len(HISTORY_TYPES))}) ORDER BY position",
            [campaign_id, *HISTORY_TYPES],
        ).fetchall()
    finally:
        conn.close()
    out.write_text("".join(str(row[0]) + "\n" for row in rows))
    return len(rows)


if __name__ == "__main__":
    print(record(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])), "events")
