"""One figure for a kernel, everywhere (issue 35, item 3): over a recorded campaign, `run`
(its result and its printed leaderboard), `campaigns`, `replay`, `best`'s header, the
lineage lesson, the report and the SQL `leaderboard` view all give each kernel the time and
speedup of its leaderboard row (`actors/campaign/leaderboard.py`), and the IQR they show is
that same run's spread."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from rich.console import Console

from actors.campaign.history import History
from actors.campaign.leaderboard import Row, campaign_leaderboard
from eventstore.codec import decode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.store import Recorded
from ops.run_cmd import _print_results as print_results
from ops.run_cmd import _result as run_result

LOG = Path(__file__).parent / "recorded" / "softmax-two-generations.jsonl"
CAMPAIGN = "recorded-softmax"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, History]:
    lines = [line for line in LOG.read_bytes().splitlines() if line]
    home = tmp_path_factory.mktemp("one-figure")
    store = DuckDBEventStore(home / "events.duckdb")
    store.append([Recorded(decode(line), line) for line in lines])
    store.close()
    history = History()
    for position, line in enumerate(lines, 1):
        history.apply(position, decode(line))
    return home, history


def _kfactory(home: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _rows(history: History) -> list[Row]:
    board = campaign_leaderboard(history, CAMPAIGN)
    assert board.best is not None and len(board.rows) >= 3
    return board.rows


def test_run_and_the_sql_view_give_every_row_its_figure(recorded: tuple[Path, History]) -> None:
    home, history = recorded
    rows = _rows(history)
    result = run_result(history, CAMPAIGN, Console(file=io.StringIO()))
    shown = {r["candidate"]: r for r in result["leaderboard"]}
    with duckdb.connect(str(home / "events.duckdb"), read_only=True) as db:
        viewed = {
            r[0]: r[1:]
            for r in db.execute(
                "SELECT candidate_id, median_ns, iqr_ns, speedup FROM leaderboard "
                "WHERE campaign_id = ?",
                [CAMPAIGN],
            ).fetchall()
        }
    for row in rows:
        figure = (row.median_ns, row.iqr_ns, row.speedup)
        said = shown[row.candidate_id]
        assert (said["median_ms"] * 1e6, said["iqr_ms"] * 1e6, said["speedup"]) == pytest.approx(
            figure, rel=1e-12
        )
        assert viewed[row.candidate_id] == pytest.approx(figure, rel=1e-12)
        # the IQR qualifies the figure: the same run's quartiles, around its median
        assert row.q1_ns is not None and row.q3_ns is not None
        assert row.q1_ns <= row.median_ns <= row.q3_ns
        assert row.q3_ns - row.q1_ns == pytest.approx(row.iqr_ns, rel=1e-9)
    best = rows[0]
    assert result["best"]["speedup"] == best.speedup
    assert result["best"]["median_ns"] == best.median_ns


def test_every_other_view_names_the_best_by_its_figure(
    recorded: tuple[Path, History], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home, history = recorded
    rows = _rows(history)
    best = rows[0]
    speedup, ms = f"{best.speedup:.2f}x", f"{best.median_ns / 1e6:.3f} ms"

    print_results(run_result(history, CAMPAIGN, Console(file=io.StringIO())))
    printed = capsys.readouterr().out
    for row in rows:
        assert f"{row.speedup:.2f}x" in printed and f"{row.median_ns / 1e6:.3f}" in printed

    (campaign,) = json.loads(_kfactory(home, "campaigns", "--json"))
    assert (campaign["best_candidate"], campaign["best_speedup"]) == (
        best.candidate_id,
        best.speedup,
    )
    assert campaign["best_ms"] == pytest.approx(best.median_ns / 1e6, rel=1e-12)

    told = json.loads(_kfactory(home, "replay", CAMPAIGN, "--json"))
    so_far = told["generations"][-1]["best_so_far"]
    assert so_far["candidate_id"] == best.candidate_id
    assert (so_far["speedup"], so_far["median_ns"]) == (best.speedup, best.median_ns)

    _kfactory(home, "best", CAMPAIGN, "-o", str(tmp_path / "best.c"))
    header = (tmp_path / "best.c").read_text().splitlines()[1]
    assert speedup in header and f"{best.median_ns / 1e6:.4f} ms" in header, header

    lineage = [
        lesson.statement
        for lesson in history.campaigns[CAMPAIGN].lessons
        if lesson.kind == "lineage"
    ][-1]
    assert f"{best.candidate_id} ({speedup})" in lineage, lineage

    _kfactory(home, "report", CAMPAIGN, "-o", str(tmp_path / "report.html"))
    html = (tmp_path / "report.html").read_text()
    for row in rows:
        assert f"{row.speedup:.3f}x" in html
    assert ms.split()[0] in html or f"{best.median_ns / 1e6:.4f}" in html
