"""The smaller items of issue 35 (item 6) in the views: the terminal leaderboard says how
many of its rows it shows and how to see more; `events show` says when nothing matched;
`campaigns`, `replay`, `report` and `best` work while a server holds the store; the report
has readable axes, timing distributions and the host."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from actors.campaign.history import History
from actors.campaign.leaderboard import campaign_leaderboard
from actors.records.story import rebuild
from eventstore.codec import decode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.events import SYSTEM_CAMPAIGN, ActorRef, HostCalibrated, new_event
from eventstore.store import Recorded
from ops.report import _roofline_figure, render_report
from ops.run_cmd import _print_results as print_results
from ops.run_cmd import _result as run_result
from ops.run_cmd import point

LOG = Path(__file__).parent / "recorded" / "softmax-two-generations.jsonl"
CAMPAIGN = "recorded-softmax"


def _history() -> History:
    history = History()
    lines = [line for line in LOG.read_bytes().splitlines() if line]
    for position, line in enumerate(lines, 1):
        history.apply(position, decode(line))
    return history


def test_the_leaderboard_says_how_many_rows_it_shows(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_result(_history(), CAMPAIGN, Console(file=io.StringIO()))
    rows = len(result["leaderboard"])
    assert rows == 6
    print_results(result, 3)
    out = capsys.readouterr().out
    assert "3 of 6 shown; `--top N` shows more" in out
    print_results(result, 10)
    assert "shown;" not in capsys.readouterr().out


def test_events_show_says_when_nothing_matches(tmp_path: Path) -> None:
    lines = [line for line in LOG.read_bytes().splitlines() if line]
    store = DuckDBEventStore(tmp_path / "events.duckdb")
    store.append([Recorded(decode(line), line) for line in lines])
    store.close()
    shown = [sys.executable, "-m", "ops.cli", "events", "show", "--home", str(tmp_path)]
    none = subprocess.run([*shown, "--type", "NoSuchType"], capture_output=True, text=True)
    assert none.returncode == 0, none.stderr
    assert none.stdout.strip() == "0 events"
    some = subprocess.run([*shown, "--limit", "2"], capture_output=True, text=True)
    assert len(some.stdout.splitlines()) == 2 and "0 events" not in some.stdout


def test_the_history_commands_read_through_a_running_server(tmp_path: Path) -> None:
    """`campaigns`, `replay`, `report` and `best` work while a server holds the store (DuckDB
    lets no reader beside it): they ask the server, as `sql` does."""
    home = tmp_path / "home"
    home.mkdir()
    lines = [line for line in LOG.read_bytes().splitlines() if line]
    store = DuckDBEventStore(home / "events.duckdb")
    store.append([Recorded(decode(line), line) for line in lines])
    store.close()
    server = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "server", "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().startswith("nats://127.0.0.1:")
        ask = [sys.executable, "-m", "ops.cli"]
        where = ["--home", str(home)]

        def run(*args: str) -> str:
            done = subprocess.run([*ask, *args, *where], capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            return done.stdout

        (campaign,) = json.loads(run("campaigns", "--json"))
        assert campaign["campaign_id"] == CAMPAIGN and campaign["best_speedup"] is not None
        told = json.loads(run("replay", CAMPAIGN, "--json"))
        assert told["generations"][-1]["best_so_far"]["candidate_id"] == campaign["best_candidate"]
        run("report", CAMPAIGN, "-o", str(tmp_path / "report.html"))
        assert campaign["best_candidate"] in (tmp_path / "report.html").read_text()
        assert campaign["best_candidate"] in run("best", CAMPAIGN)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_report_has_readable_axes_timing_distributions_and_the_host() -> None:
    history = _history()
    board = campaign_leaderboard(history, CAMPAIGN)
    device = board.rows[0].timed.device
    calibrated = new_event(
        HostCalibrated,
        campaign_id=SYSTEM_CAMPAIGN,
        actor=ActorRef.here("benchmarker"),
        device=device,
        bandwidth_gbs=20.0,
        peak_gflops=200.0,
        method={"cpu": "Test CPU 9000", "cores": 2, "isa": "x86-64 avx2 fma"},
    )
    roofline, _ = _roofline_figure(board.rows, [calibrated])
    for axis in (roofline.layout.xaxis, roofline.layout.yaxis):
        assert (axis.type, axis.dtick, axis.exponentformat) == ("log", 1, "none")
    lines = [line for line in LOG.read_bytes().splitlines() if line]
    rebuilt = rebuild([(p, decode(line)) for p, line in enumerate(lines, 1)], CAMPAIGN)
    html = render_report(rebuilt, [calibrated])
    assert 'id="timings"' in html
    for said in ("Test CPU 9000", "x86-64 avx2 fma", device):
        assert said in html


def test_the_leaderboard_prints_every_point_in_full(capsys: pytest.CaptureFixture[str]) -> None:
    """A point has a dozen parameters: in a column of the table they were cut short
    (`schedule=stat…`); each shown row's point is printed whole below it."""
    result = run_result(_history(), CAMPAIGN, Console(file=io.StringIO()))
    print_results(result, 10)
    printed = " ".join(capsys.readouterr().out.split())
    assert "…" not in printed
    for row in result["leaderboard"]:
        words = point(row["params"])
        assert f"{row['template']}: {words}" in printed, words
    quoted = point({"threads": 2, "flags": "-O3 -march=native"})
    assert quoted == "threads=2 flags='-O3 -march=native'"
