"""What a user takes away from a recorded campaign: the campaigns list and diff, the SQL
views, the Parquet export, and the HTML report rendered in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from eventstore.views import VIEW_NAMES
from tests.recorded_campaign import (
    CAMPAIGN_ID,
    copy_home,
    kfactory,
    read_rows,
    rechain,
    recorded,
    write_rows,
)

TWIN = "twin"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture
def home(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    source, _ = recorded(tmp_path_factory)
    return copy_home(source, tmp_path / "copy")


def add_shorter_twin(home: Path) -> int:
    """Record a second campaign of the same problem: the first one's events up to its
    first close, under new ids (a campaign that stopped after one generation)."""
    rows = read_rows(home)
    own = [r for r in rows if r["campaign_id"] == CAMPAIGN_ID]
    first_close = next(i for i, r in enumerate(own) if r["type"] == "GenerationClosed")
    fresh: dict[str, str] = {}

    def renamed(text: str) -> str:
        text = UUID.sub(lambda m: fresh.setdefault(m.group(0), str(uuid.uuid4())), text)
        return text.replace(f'"{CAMPAIGN_ID}', f'"{TWIN}').replace(f"{CAMPAIGN_ID}:", f"{TWIN}:")

    for row in own[: first_close + 1]:
        payload = renamed(str(row["payload"]))
        rows.append(
            dict(
                row,
                payload=payload,
                campaign_id=TWIN,
                event_id=json.loads(payload)["event_id"],
                causation_id=json.loads(payload)["causation_id"],
                correlation_id=json.loads(payload)["correlation_id"],
            )
        )
    rechain(rows)
    write_rows(home, rows)
    verdicts = ("KernelVerified", "KernelRejected")
    copied = own[: first_close + 1]
    return len({json.loads(r["payload"])["candidate_id"] for r in copied if r["type"] in verdicts})


def test_campaigns_lists_and_diffs_two_campaigns_of_one_problem(home: Path) -> None:
    evaluated_twin = add_shorter_twin(home)
    listed = kfactory("campaigns", "--home", str(home), "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["campaign_id"]: r for r in json.loads(listed.stdout)}
    assert set(rows) == {CAMPAIGN_ID, TWIN}
    assert rows[TWIN]["state"] == "unfinished"
    assert rows[TWIN]["evaluated"] == evaluated_twin < rows[CAMPAIGN_ID]["evaluated"]
    # The best is promoted head to head, not by the highest recorded speedup, so a longer
    # campaign's best need not show the larger figure; each has one.
    assert rows[CAMPAIGN_ID]["best_speedup"] > 0 and rows[TWIN]["best_speedup"] > 0
    done = kfactory("campaigns", "diff", CAMPAIGN_ID, TWIN, "--home", str(home), "--json")
    assert done.returncode == 0, done.stderr
    compared = json.loads(done.stdout)
    assert compared["a"]["evaluated"] == rows[CAMPAIGN_ID]["evaluated"]
    assert compared["b"]["evaluated"] == evaluated_twin
    assert 1 <= compared["b"]["evaluations_to_95pct"] <= evaluated_twin
    assert compared["lessons_only_in_a"], "the longer campaign drew lessons the twin did not"
    assert kfactory("campaigns", "--home", str(home)).returncode == 0
    other = kfactory("campaigns", "diff", CAMPAIGN_ID, "nope", "--home", str(home))
    assert other.returncode == 2 and other.stderr.count("\n") == 1


def test_views_answer_the_readme_questions_without_the_payload_layout(home: Path) -> None:
    conn = duckdb.connect(str(home / "events.duckdb"), read_only=True)
    try:
        candidates = conn.execute(
            "SELECT status, count(*) FROM candidates WHERE campaign_id = ? GROUP BY status",
            [CAMPAIGN_ID],
        ).fetchall()
        events = conn.execute(
            "SELECT count(*) FROM events WHERE type = 'CandidateProposed' AND campaign_id = ?",
            [CAMPAIGN_ID],
        ).fetchone()
        top = conn.execute(
            "SELECT candidate_id, pooled_median_ns, runs, median_ns, run_mean_ns FROM leaderboard "
            "WHERE rank = 1 AND campaign_id = ?",
            [CAMPAIGN_ID],
        ).fetchone()
        winner = conn.execute(
            "SELECT payload->'order'->>0 FROM events "
            "WHERE type = 'FinalRankingTimed' AND campaign_id = ?",
            [CAMPAIGN_ID],
        ).fetchone()
        assert top is not None
        own_run = conn.execute(
            "SELECT CAST(payload->>'median_ns' AS DOUBLE) FROM events "
            "WHERE type = 'BenchmarkCompleted' AND payload->>'candidate_id' = ?",
            [top[0]],
        ).fetchone()
        lessons = conn.execute("SELECT count(*) FROM lessons").fetchone()
        steps = conn.execute("SELECT count(*) FROM steps WHERE seconds < 0").fetchone()
    finally:
        conn.close()
    assert events is not None and sum(n for _, n in candidates) == events[0]
    # rank 1 is the winner of the final run (the top kernels timed together once the search
    # ended); its own run's median is the one its event recorded, and with no head-to-head
    # run that timed it, its pooled time is that run's time (the mean over the timed calls,
    # where the event kept it)
    assert winner is not None and own_run is not None
    assert top[0] == winner[0] and top[3] == own_run[0]
    assert top[2] > 1 or top[1] == (top[4] if top[4] is not None else top[3])
    assert lessons is not None and lessons[0] > 0
    assert steps == (0,)


def test_export_writes_events_and_every_projection_as_parquet(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "parquet"
    done = kfactory("export", CAMPAIGN_ID, "--parquet", str(out), "--home", str(home), "--json")
    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout)
    assert set(written) == {"events", *VIEW_NAMES}
    events = pq.read_table(out / "events.parquet")
    own = [r for r in read_rows(home) if r["campaign_id"] == CAMPAIGN_ID]
    assert events.num_rows == written["events"] == len(own)
    assert events.column("chain_hash").to_pylist()[-1] == own[-1]["chain_hash"]
    board = pq.read_table(out / "leaderboard.parquet")
    assert board.num_rows == written["leaderboard"] > 0
    # the rows the leaderboard view shows for the campaign (rank 1 is the best promoted head
    # to head, by pooled time: not always the largest speedup of its own run)
    query = (
        f"SELECT rank, candidate_id, speedup FROM leaderboard WHERE campaign_id = '{CAMPAIGN_ID}'"
    )
    shown = kfactory("sql", query, "-f", "json", "--home", str(home))
    assert shown.returncode == 0, shown.stderr
    columns = [board.column(c).to_pylist() for c in ("rank", "candidate_id", "speedup")]
    exported = list(zip(*columns, strict=True))
    viewed = [(r["rank"], r["candidate_id"], r["speedup"]) for r in json.loads(shown.stdout)]
    assert sorted(exported) == sorted(viewed) and min(r[0] for r in viewed) == 1


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.timeout(240)
def test_the_report_renders_in_headless_chromium(home: Path, tmp_path: Path) -> None:
    browser = chromium()
    if browser is None:
        pytest.skip("no chromium binary on PATH (.ci/run installs Debian's chromium)")
    page = tmp_path / "report.html"
    done = kfactory("report", CAMPAIGN_ID, "-o", str(page), "--home", str(home))
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert not re.search(r"<script[^>]+src=", text), "the report must not fetch scripts"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000"]
    dom = subprocess.run(
        [browser, *flags, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console
    assert re.search(r'id="errors">\s*</p>', dom.stdout), "the page reported an error"
    for chart in ("curve", "roofline"):  # plotly drew an SVG inside each chart
        start = dom.stdout.index(f'id="{chart}"')
        assert "main-svg" in dom.stdout[start : start + 20_000], f"{chart} was not drawn"
    assert "Leaderboard" in dom.stdout and "Winning kernel" in dom.stdout
    assert "promoted: timed first" in text, "the leaderboard says how its best was promoted"
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            browser,
            *flags,
            "--hide-scrollbars",
            "--window-size=1280,2400",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 50_000, "the screenshot is blank"
