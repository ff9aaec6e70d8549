"""One real campaign per test session (real swarm, real kernels, real DuckDB), recorded
once and copied into each test that audits, replays, reports or tampers with it.

And recorded event logs kept in tests/recorded/ (a real campaign's events, one JSON
payload a line, in store order), from which the actors' decision functions are driven
without a bus or a device. `python -m tests.recorded_campaign record` records them again.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from actors.campaign.history import History
from eventstore.codec import decode, encode
from eventstore.events import Event
from eventstore.store import GENESIS, chain_hash
from tests.session_share import locked, shared_dir

CAMPAIGN_ID = "audited"
CAMPAIGN = f"""
name = "{CAMPAIGN_ID}"
problem = "softmax"
target = "cpu"
shapes = [[512, 2048]]
[budget]
candidates = 4
wall_time = "10m"
stop_at_roofline = 1.5
[search]
per_generation = 2
seed = 5
"""


LOGS = Path(__file__).parent / "recorded"
TWO_GENERATIONS = "softmax-two-generations"
"""6 softmax candidates in 2 generations at 256 x 1024 on the CPU: every one written,
verified and timed, then lessons and generations closed."""
LOG_CAMPAIGNS = {
    TWO_GENERATIONS: """
name = "recorded-softmax"
problem = "softmax"
target = "cpu"
shapes = [[256, 1024]]
[budget]
candidates = 6
wall_time = "10m"
stop_at_roofline = 1.5
[search]
per_generation = 3
seed = 7
""",
}


def load_log(name: str) -> list[Event]:
    """A recorded log's events, in the order the store held them."""
    lines = (LOGS / f"{name}.jsonl").read_bytes().splitlines()
    return [decode(line) for line in lines if line]


def history_of(events: list[Event], until: str | None = None) -> History:
    """The history as an actor sees it once it has caught up to event `until` (inclusive),
    or to the end of the log."""
    history = History()
    for position, event in enumerate(events, 1):
        history.apply(position, event)
        if event.event_id == until:
            return history
    if until is not None:
        raise KeyError(f"event {until} is not in the log")
    return history


def save_log(home: Path, name: str) -> Path:
    """Write the store of `home` as the recorded log `name`."""
    conn = duckdb.connect(str(home / "events.duckdb"), read_only=True)
    try:
        rows = conn.execute("SELECT CAST(payload AS VARCHAR) FROM events ORDER BY position")
        payloads = [row[0] for row in rows.fetchall()]
    finally:
        conn.close()
    path = LOGS / f"{name}.jsonl"
    path.write_text("".join(payload + "\n" for payload in payloads))
    return path


def record_logs(workdir: Path) -> None:
    """Run each log's campaign with the real swarm and keep its events."""
    for name, campaign in LOG_CAMPAIGNS.items():
        (workdir / f"{name}.toml").write_text(campaign)
        home = workdir / name
        done = kfactory("run", str(workdir / f"{name}.toml"), "--home", str(home), timeout=900)
        assert done.returncode == 0, done.stderr
        print(save_log(home, name))


def kfactory(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The home of the session's campaign and its `kfactory run --json` result: run once
    per session, by whichever xdist worker asks first (the others wait for it)."""
    root = shared_dir(tmp_path_factory, "recorded-campaign")
    result_file = root / "run.json"
    with locked(root):
        if not result_file.exists():
            (root / "campaign.toml").write_text(CAMPAIGN)
            done = kfactory(
                "run",
                str(root / "campaign.toml"),
                "--home",
                str(root / "home"),
                "--json",
                timeout=600,
            )
            assert done.returncode == 0, done.stderr
            result_file.write_text(done.stdout)
    return root / "home", json.loads(result_file.read_text())


def copy_home(source: Path, target: Path) -> Path:
    """A copy of the store alone (no server state), for a test to read or tamper with."""
    target.mkdir(parents=True)
    shutil.copy2(source / "events.duckdb", target / "events.duckdb")
    return target


# --- tampering with the file directly, as someone with write access to it could -------

Row = dict[str, Any]


def read_rows(home: Path) -> list[Row]:
    conn = duckdb.connect(str(home / "events.duckdb"))
    try:
        cursor = conn.execute("SELECT * FROM events ORDER BY position")
        names = [d[0] for d in cursor.description or []]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    finally:
        conn.close()


def write_rows(home: Path, rows: list[Row], renumber: bool = True) -> None:
    if renumber:
        for index, row in enumerate(rows, 1):
            row["position"] = index
    conn = duckdb.connect(str(home / "events.duckdb"))
    try:
        conn.execute("DELETE FROM events")
        names = list(rows[0])
        conn.executemany(
            f"INSERT INTO events ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
            [[row[n] for n in names] for row in rows],
        )
    finally:
        conn.close()


def rechain(rows: list[Row]) -> None:
    """Recompute every chain hash, as a forger who rewrites the whole chain would."""
    heads: dict[str, bytes] = {}
    for row in rows:
        previous = heads.get(row["campaign_id"], GENESIS)
        sequence = row["stream_seq"]
        row["chain_hash"] = chain_hash(
            str(row["payload"]).encode(), previous, None if sequence is None else int(sequence)
        )
        heads[row["campaign_id"]] = row["chain_hash"]


def set_payload(row: Row, event: Event) -> None:
    """The payload, and every column the store reads from it, as a careful forger sets them."""
    row.update(
        payload=encode(event).decode(),
        event_id=event.event_id,
        campaign_id=event.campaign_id,
        type=event.type,
        schema=event.schema,
        ts=event.ts,
        actor_role=event.actor.role,
        actor_instance=event.actor.instance,
        actor_host=event.actor.host,
        causation_id=event.causation_id,
        correlation_id=event.correlation_id,
    )


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["record"]:
        sys.exit("usage: python -m tests.recorded_campaign record")
    with tempfile.TemporaryDirectory() as scratch:
        record_logs(Path(scratch))
