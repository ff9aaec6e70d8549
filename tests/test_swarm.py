"""The swarm end to end: real nats-server, recorder, DuckDB, compiler and sandbox."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.recorded_campaign import CAMPAIGN_ID, copy_home, recorded

CAMPAIGN = """
name = "{name}"
problem = "softmax"
target = "cpu"
shapes = [[512, 2048]]
[budget]
candidates = {budget}
wall_time = "10m"
stop_at_roofline = 1.5
[search]
per_generation = {per_generation}
seed = 3
"""


def campaign_file(tmp_path: Path, name: str, budget: int = 6, per_generation: int = 3) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(CAMPAIGN.format(name=name, budget=budget, per_generation=per_generation))
    return path


def kfactory(*args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ops.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,  # type: ignore[call-overload]
    )


def sql(home: Path, query: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", "sql", query, "-f", "json", "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


def outcomes_per_candidate(home: Path, campaign: str) -> list[dict[str, object]]:
    return sql(
        home,
        "SELECT payload->>'candidate_id' AS candidate, count(*) AS n FROM events "
        f"WHERE campaign_id = '{campaign}' AND type IN ('KernelVerified', 'KernelRejected') "
        "AND payload->>'stage' IS DISTINCT FROM 'benchmark' "
        "GROUP BY candidate ORDER BY n DESC",
    )


def test_a_campaign_finds_a_verified_kernel_faster_than_numpy_and_learns(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # the session's recorded campaign (two generations of two), shared with the audit tests
    source, result = recorded(tmp_path_factory)
    home = copy_home(source, tmp_path / "copy")
    assert result["campaign_id"] == CAMPAIGN_ID
    assert result["evaluated"] >= 1
    assert result["best"]["speedup"] > 1.0, result
    assert 0 < result["best"]["roofline_fraction"] <= 1.0

    best = sql(
        home,
        "SELECT count(*) AS n FROM events WHERE type = 'KernelVerified' "
        f"AND payload->>'source_hash' = '{result['best']['source_hash']}'",
    )
    assert best == [{"n": 1}]

    lessons = sql(
        home,
        "SELECT payload->>'kind' AS kind, payload->'evidence_ids' AS ids FROM events "
        "WHERE type = 'LessonLearned'",
    )
    assert lessons, "no lesson was drawn"
    cited = {i for row in lessons for i in json.loads(str(row["ids"]))}
    assert cited
    found = sql(
        home,
        "SELECT count(*) AS n FROM events WHERE event_id IN ("
        + ", ".join(f"'{i}'" for i in sorted(cited))
        + ")",
    )
    assert found == [{"n": len(cited)}], "a lesson cites an event that does not exist"
    closed = sql(home, "SELECT count(*) AS n FROM events WHERE type = 'GenerationClosed'")
    assert closed == [{"n": 2}]


def test_a_killed_run_resumes_without_evaluating_any_candidate_twice(tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec = campaign_file(tmp_path, "resume", budget=4, per_generation=2)
    first = kfactory("run", str(spec), "--home", str(home), start_new_session=True)
    deadline = time.monotonic() + 240
    verified = 0
    while time.monotonic() < deadline and verified < 2:
        time.sleep(1)
        if (home / "server.json").exists():
            try:
                verified = int(
                    sql(home, "SELECT count(*) AS n FROM events WHERE type = 'KernelVerified'")[0][
                        "n"
                    ]  # type: ignore[call-overload]
                )
            except AssertionError:
                continue
    assert verified >= 2, "the first run verified nothing in time"
    os.killpg(first.pid, signal.SIGKILL)  # the run, its nats-server and its sandboxes
    first.wait()

    second = kfactory("run", str(spec), "--home", str(home), "--json")
    out, err = second.communicate(timeout=400)
    assert second.returncode == 0, err
    resumed = sql(home, "SELECT count(*) AS n FROM events WHERE type = 'CampaignResumed'")
    assert resumed == [{"n": 1}]
    result = json.loads(out)
    assert result["finished"].startswith("budget")
    per_candidate = outcomes_per_candidate(home, "resume")
    assert per_candidate and per_candidate[0]["n"] == 1, per_candidate
    proposed = sql(
        home,
        "SELECT count(*) AS n, count(DISTINCT payload->>'param_key') AS keys FROM events "
        "WHERE campaign_id = 'resume' AND type = 'CandidateProposed'",
    )
    assert proposed[0]["n"] == proposed[0]["keys"] == 4


@pytest.mark.slow  # a whole campaign with actor processes: about 65 s
@pytest.mark.timeout(600)
def test_two_verifier_processes_split_the_work_and_lose_none(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "KF_HOME": str(home)}
    server = kfactory("server", env=env)
    assert server.stdout is not None
    url = server.stdout.readline().strip()
    actors = [
        kfactory("actor", role, "--nats", url, "--instance", f"{role}-{i}", env=env)
        for i, role in enumerate(
            [
                "planner",
                "kernel-writer",
                "fuser",
                "librarian",
                "benchmarker",
                "verifier",
                "verifier",
            ]
        )
    ]
    try:
        run = kfactory(
            "run",
            str(campaign_file(tmp_path, "split", budget=8, per_generation=8)),
            "--nats",
            url,
            "--json",
            "--no-local-actors",  # the actors above may still be starting: start none here
            env=env,
        )
        out, err = run.communicate(timeout=500)
        assert run.returncode == 0, err
        assert json.loads(out)["evaluated"] == 8
        by_instance = sql(
            home,
            "SELECT actor_instance AS who, count(*) AS n FROM events WHERE campaign_id = 'split' "
            "AND type IN ('KernelVerified', 'KernelRejected') AND actor_role = 'verifier' "
            "GROUP BY who ORDER BY who",
        )
        assert [row["who"] for row in by_instance] == ["verifier-5", "verifier-6"], by_instance
        assert sum(int(row["n"]) for row in by_instance) == 8  # type: ignore[call-overload]
        per_candidate = outcomes_per_candidate(home, "split")
        assert len(per_candidate) == 8 and per_candidate[0]["n"] == 1
    finally:
        for process in [*actors, server]:
            process.send_signal(signal.SIGTERM)
        for process in [*actors, server]:
            process.wait(60)
