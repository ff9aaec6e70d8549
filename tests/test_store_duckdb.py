"""The DuckDB file store: durability across reopen, tamper evidence, read-only SQL."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from eventstore.codec import encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.sql_guard import SqlRefused
from eventstore.store import Recorded
from tests.conftest import calibrated, started


def fill(path: Path, n: int = 6) -> DuckDBEventStore:
    store = DuckDBEventStore(path)
    events = [started("a") if i % 2 else calibrated("b") for i in range(n)]
    store.append([Recorded(e, encode(e), i + 1) for i, e in enumerate(events)], stream_cursor=n)
    return store


def test_reopening_continues_positions_chain_and_cursor(tmp_path: Path) -> None:
    path = tmp_path / "e.duckdb"
    fill(path).close()
    store = DuckDBEventStore(path)
    assert (store.last_position, store.stream_cursor) == (6, 6)
    more = started("a")
    store.append([Recorded(more, encode(more))])
    assert store.last_position == 7
    assert store.verify_chain().ok
    store.close()


def test_an_edited_payload_breaks_the_chain_at_that_position(tmp_path: Path) -> None:
    path = tmp_path / "e.duckdb"
    fill(path).close()
    with duckdb.connect(str(path)) as raw:  # an attacker with the file
        raw.execute(
            "UPDATE events SET payload = replace(payload::VARCHAR, '36.0', '99.0') "
            "WHERE position = 3"
        )
    store = DuckDBEventStore(path, read_only=True)
    report = store.verify_chain()
    store.close()
    assert not report.ok
    assert report.broken_at_position == 3
    assert report.broken_campaign == "b"
    assert "position 3" in report.detail


def test_a_deleted_row_breaks_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "e.duckdb"
    fill(path).close()
    with duckdb.connect(str(path)) as raw:
        raw.execute("DELETE FROM events WHERE position = 2")
    store = DuckDBEventStore(path, read_only=True)
    report = store.verify_chain("a")
    store.close()
    assert not report.ok and report.broken_at_position == 4


WRITES = [
    "INSERT INTO events SELECT * FROM events",
    "UPDATE events SET type = 'x'",
    "DELETE FROM events",
    "DROP TABLE events",
    "ATTACH '/tmp/kf-other.duckdb' AS other",
    "COPY events TO '/tmp/kf-leak.csv'",
    "PRAGMA enable_profiling",
    "SELECT 1; DELETE FROM events",
    "SELECT count(*) FROM events; SELECT 2",
    "CREATE TABLE t AS SELECT 1",
    "SET enable_external_access = true",
]


@pytest.mark.parametrize("statement", WRITES)
def test_sql_that_writes_is_refused_and_changes_nothing(tmp_path: Path, statement: str) -> None:
    store = fill(tmp_path / "e.duckdb")
    before = store.query("SELECT count(*), max(position), bit_xor(hash(chain_hash)) FROM events")
    with pytest.raises(SqlRefused):
        store.query(statement)
    after = store.query("SELECT count(*), max(position), bit_xor(hash(chain_hash)) FROM events")
    assert after.rows == before.rows
    assert store.verify_chain().ok
    store.close()


def test_queries_cannot_reach_the_file_system(tmp_path: Path) -> None:
    store = fill(tmp_path / "e.duckdb")
    with pytest.raises(duckdb.PermissionException):
        store.query("SELECT * FROM read_csv('/etc/passwd')")
    store.close()


def test_select_and_with_queries_work_on_json_payloads(tmp_path: Path) -> None:
    store = fill(tmp_path / "e.duckdb")
    result = store.query(
        "WITH cal AS (SELECT payload->>'bandwidth_gbs' AS bw FROM events "
        "WHERE type = 'HostCalibrated') SELECT count(*), min(bw) FROM cal"
    )
    assert result.columns[0] == "count_star()"
    assert result.rows == [[3, "36.0"]]
    capped = store.query("SELECT position FROM events ORDER BY position", max_rows=2)
    assert capped.rows == [[1], [2]] and capped.truncated
    store.close()


def test_a_second_writer_is_told_who_owns_the_file(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "e.duckdb"
    owner = fill(path)
    probe = (
        "import sys\n"
        "from eventstore.duckdb_store import DuckDBEventStore, StoreLocked\n"
        "try:\n"
        f"    DuckDBEventStore({str(path)!r}, read_only=True)\n"
        "except StoreLocked as exc:\n"
        "    print('locked:', exc); sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    owner.close()
    assert done.returncode == 3, done.stderr
    assert "in use by another process" in done.stdout
