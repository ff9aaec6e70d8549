"""Every timed call has a deadline from the problem's cost and the kernel's own
verification pace (`gpu_workers/deadlines.py`). A kernel that passes verification and
then never returns at the timed shape is rejected as `timeout` at the benchmark stage, the
shape named: by `kfactory check --bench`, and in a campaign; and a campaign that ended
while such a kernel was being timed leaves nothing a later campaign in the same run
folder waits on (issue 35, item 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from gpu_workers.deadlines import FLOOR_SECONDS, SLACK, call_deadline, work
from gpu_workers.results import Pace
from kernels.loading import load_problem
from tests.cpu_support import PLANTED

HANGS = PLANTED / "hangs_at_timed_shape.c"
TIMED = "rows=1024, cols=1024"
#: Hangs at 4096 x 4096, where its call deadline is a minute or more: a short campaign
#: always ends while it is timed (and, another source, it is not the seed already judged).
HANGS_LONGER = PLANTED / "hangs_at_4096_squared.c"
CHECK = (sys.executable, "-m", "ops.cli", "check", "--json")


def test_a_call_s_deadline_scales_the_verification_pace_by_the_work() -> None:
    softmax = load_problem("softmax")
    small, large = {"rows": 8, "cols": 1024}, {"rows": 1024, "cols": 1024}
    pace = Pace(seconds=2.0, work=work(softmax, small) * 100)
    assert call_deadline(softmax, large, pace) == pytest.approx(SLACK * 2.0 * 128 / 100)
    assert call_deadline(softmax, small, pace) == FLOOR_SECONDS
    slow_incumbent = call_deadline(softmax, small, pace, incumbent_ns=1e9)
    assert slow_incumbent == pytest.approx(SLACK * 1.0)


def test_check_bench_rejects_a_kernel_that_hangs_at_the_timed_shape() -> None:
    done = subprocess.run(
        [*CHECK, "softmax", "--source", str(HANGS), "--bench", "--shape", "rows=1024,cols=1024"],
        capture_output=True,
        text=True,
        timeout=240,  # the run limit it had before deadlines was 600 s
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert (report["stage"], report["reason"]) == ("benchmark", "timeout"), report
    assert TIMED in report["message"], report


def _campaign(
    folder: Path, name: str, wall_time: str, seed: Path | None, rows_cols: int = 1024
) -> Path:
    path = folder / f"{name}.toml"
    sources = f'\n[seed]\nsources = ["{seed}"]\n' if seed is not None else ""
    path.write_text(
        f"""name = "{name}"
problem = "softmax"
shapes = [[{rows_cols}, {rows_cols}]]

[budget]
candidates = 1
wall_time = "{wall_time}"

[search]
per_generation = 1
{sources}"""
    )
    return path


def _run(campaign: Path, home: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", "run", str(campaign), "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _rows(home: Path, sql: str) -> list[tuple[object, ...]]:
    with duckdb.connect(str(home / "events.duckdb"), read_only=True) as db:
        return db.execute(sql).fetchall()


def test_a_campaign_rejects_the_hanging_kernel_and_the_next_campaign_is_not_held_up(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    _run(_campaign(tmp_path, "hangs", "200s", HANGS), home)
    rejected = _rows(
        home,
        "SELECT payload->>'stage', payload->>'reason', payload->'evidence'->>'message' "
        "FROM events WHERE type = 'KernelRejected' AND campaign_id = 'hangs'",
    )
    assert len(rejected) == 1 and rejected[0][:2] == ("benchmark", "timeout"), rejected
    assert TIMED in str(rejected[0][2])
    # A campaign that ends (its wall time) while the kernel is timed; then another.
    cut_short = _run(_campaign(tmp_path, "cut-short", "10s", HANGS_LONGER, 4096), home)
    assert "finished: budget reached: wall time" in cut_short, cut_short
    out = _run(_campaign(tmp_path, "after", "200s", None), home)
    assert "finished: budget reached" in out, out
    timed = _rows(
        home,
        "SELECT count(*) FROM events WHERE type = 'BenchmarkCompleted' AND campaign_id = 'after'",
    )
    assert timed == [(1,)]
    # The job left over from the campaign cut short was never timed to an end, by its own
    # swarm or the next: at most its deadline's rejection (a shutdown that overlaps the
    # deadline lets the job record it) and the close of its generation came after.
    leftover = _rows(
        home,
        "SELECT type, payload->>'stage', payload->>'reason' FROM events "
        "WHERE campaign_id = 'cut-short' AND position > "
        "(SELECT position FROM events WHERE campaign_id = 'cut-short' "
        "AND type = 'CampaignFinished')",
    )
    settled = {("KernelRejected", "benchmark", "timeout")}
    closing = {("LessonLearned", None, None), ("GenerationClosed", None, None)}
    assert set(leftover) <= settled | closing, leftover
    assert sum(1 for row in leftover if row in settled) <= 1, leftover
