"""Recorded event logs for the actors' decision tests: a real campaign's events, in
store order, one JSON event a line (the way Kernel Tuner tests its strategies from a
recorded cache instead of a device).

Record one from a campaign's home: `python -m tests.decision_log HOME CAMPAIGN_ID OUT`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import duckdb

from actors.campaign.history import HISTORY_TYPES, History
from eventstore.codec import decode
from eventstore.events import Event

LOGS = Path(__file__).parent / "logs"


def read_log(name: str) -> list[Event]:
    lines = (LOGS / name).read_text().splitlines()
    return [decode(line.encode()) for line in lines if line.strip()]


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
