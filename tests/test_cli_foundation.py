"""`kfactory` as a user runs it: real processes, a real server, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eventstore.codec import encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.store import Recorded
from tests.conftest import calibrated, started


def kfactory(*args: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,  # type: ignore[call-overload]
    )


@pytest.mark.parametrize("command", [[], ["events"], ["bench"]])
def test_every_group_has_help(command: list[str]) -> None:
    done = kfactory(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout and "Commands" in done.stdout


@pytest.mark.parametrize(
    "command", [["server"], ["sql"], ["events", "tail"], ["actor"], ["bench", "store"], ["run"]]
)
def test_every_command_has_help_with_an_example(command: list[str]) -> None:
    done = kfactory(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert "Usage" in done.stdout and "Example" in done.stdout


def test_actor_help_lists_the_roles() -> None:
    done = kfactory("actor", "--help")
    for role in ("planner", "kernel-writer", "fuser", "verifier", "benchmarker", "librarian"):
        assert role in done.stdout


def test_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    cases = [
        (["sql", "SELECT 1", "--home", str(tmp_path)], "no event store at"),
        (["actor", "nobody", "--nats", "nats://127.0.0.1:1"], "unknown role"),
        (["run"], "give a campaign file"),
        (["run", str(tmp_path / "missing.toml")], "cannot read"),
        (["run", "--problem", "nope"], "unknown problem"),
        (["events", "tail", "--campaign", "a.b", "--nats", "nats://x:1"], "invalid campaign id"),
    ]
    for args, message in cases:
        done = kfactory(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_sql_on_the_file_when_no_server_runs(tmp_path: Path) -> None:
    store = DuckDBEventStore(tmp_path / "events.duckdb")
    events = [started(), calibrated(), calibrated()]
    store.append([Recorded(e, encode(e)) for e in events])
    store.close()
    home = ["--home", str(tmp_path)]
    done = kfactory(
        "sql",
        "SELECT type, count(*) AS n FROM events GROUP BY type ORDER BY type",
        "--format",
        "json",
        *home,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        {"type": "CampaignStarted", "n": 1},
        {"type": "HostCalibrated", "n": 2},
    ]
    as_csv = kfactory("sql", "SELECT position FROM events ORDER BY 1", "-f", "csv", *home)
    assert as_csv.stdout.split() == ["position", "1", "2", "3"]
    refused = kfactory("sql", "DELETE FROM events", *home)
    assert refused.returncode == 2 and "refused" in refused.stderr
    again = kfactory("sql", "SELECT count(*) AS n FROM events", "-f", "json", *home)
    assert json.loads(again.stdout) == [{"n": 3}]


def test_server_records_serves_sql_and_streams_events(tmp_path: Path) -> None:
    env = {**os.environ, "KF_HOME": str(tmp_path / "home")}
    server = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "server"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        assert url.startswith("nats://127.0.0.1:")
        second = kfactory("server", env=env)
        assert second.returncode == 2 and "already owns" in second.stderr

        tail = subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "events", "tail", "--all", "--limit", "2", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        publish = (
            "import asyncio, sys\n"
            "from pathlib import Path\n"
            "from bus.connection import connect, jetstream\n"
            "from eventstore.emitter import Emitter\n"
            "from ops.accounts import client_auth\n"
            "from tests.conftest import started\n"
            "async def main():\n"
            "    auth = client_auth(Path(sys.argv[2]), 'cli')  # the server made it\n"
            "    nc = await connect(sys.argv[1], 'p', auth=auth)\n"
            "    await Emitter(jetstream(nc)).emit_many([started(), started()])\n"
            "    await nc.close()\n"
            "asyncio.run(main())\n"
        )
        home = str(tmp_path / "home")
        subprocess.run([sys.executable, "-c", publish, url, home], check=True, timeout=60)
        out, _ = tail.communicate(timeout=60)
        lines = [json.loads(line) for line in out.splitlines()]
        assert [line["type"] for line in lines] == ["CampaignStarted", "CampaignStarted"]

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = kfactory("sql", "SELECT count(*) AS n FROM events", "-f", "json", env=env)
            if done.returncode == 0 and json.loads(done.stdout) == [{"n": 2}]:
                break
            time.sleep(0.2)
        assert json.loads(done.stdout) == [{"n": 2}], done.stderr
        refused = kfactory("sql", "DROP TABLE events", env=env)
        assert refused.returncode == 2 and "refused" in refused.stderr
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(30) == 0
    assert not (tmp_path / "home" / "server.json").exists()


def test_a_bad_campaign_file_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('problem = "softmax"\n[budget]\ncandidates = "many"\n')
    done = kfactory("run", str(bad), "--home", str(tmp_path))
    assert done.returncode == 2
    assert "$.budget.candidates" in done.stderr and "Expected `int`" in done.stderr
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('problem = "softmax"\n[search]\nper_gen = 3\n')
    done = kfactory("run", str(unknown), "--home", str(tmp_path))
    assert done.returncode == 2 and "per_gen" in done.stderr


def test_bench_store_reports_every_figure(tmp_path: Path) -> None:
    done = kfactory(
        "bench",
        "store",
        "--events",
        "2000",
        "--replay-events",
        "3000",
        "--sql-repeats",
        "2",
        "--json",
        "--workdir",
        str(tmp_path),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    for key in ("ingest_events_per_s", "replay_1m_s", "sql_p50_ms", "sql_p99_ms"):
        assert figures[key] > 0, key
    assert figures["replay_events"] == 3000 and figures["ingest_events"] == 2000
