"""One real campaign per test session (real swarm, real kernels, real DuckDB), recorded
once and copied into each test that audits, replays, reports or tampers with it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from eventstore.codec import encode
from eventstore.events import Event
from eventstore.store import GENESIS, chain_hash

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


def kfactory(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The home of the session's campaign and its `kfactory run --json` result."""
    root = tmp_path_factory.getbasetemp() / "recorded-campaign"
    result_file = root / "run.json"
    if not result_file.exists():
        root.mkdir(exist_ok=True)
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
        row["chain_hash"] = chain_hash(str(row["payload"]).encode(), previous)
        heads[row["campaign_id"]] = row["chain_hash"]


def set_payload(row: Row, event: Event) -> None:
    row["payload"] = encode(event).decode()
