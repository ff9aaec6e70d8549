"""`kfactory server` as an operator runs it: `kfactory run` in front of it starts the roles
it lacks, a campaign finishes although the nats-server child is killed mid-way, results
go to stdout and progress lines to stderr, and a restarted server keeps its URL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CAMPAIGN = """
name = "supervised"
problem = "softmax"
target = "cpu"
shapes = [[256, 1024]]
[budget]
candidates = 2
wall_time = "10m"
[search]
per_generation = 2
seed = 3
"""


def _server(home: Path) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "server", "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    assert url.startswith("nats://127.0.0.1:"), process.stderr.read() if process.stderr else ""
    return process, url


def _nats_child(parent: int) -> int:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            name = stat.read_text().split("(", 1)[1].rsplit(")", 1)[0]
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent and name == "nats-server":
            return int(stat.parent.name)
    raise AssertionError(f"no nats-server child of {parent}")


def _stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode in (0, 130), err
    return err


@pytest.mark.slow
def test_a_campaign_survives_its_nats_server_and_the_server_keeps_its_url(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    server, url = _server(home)
    try:
        campaign = tmp_path / "supervised.toml"
        campaign.write_text(CAMPAIGN)
        run = subprocess.Popen(
            [sys.executable, "-m", "ops.cli", "run", str(campaign), "--home", str(home)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(20)  # the roles started here, the campaign under way
        assert run.poll() is None
        os.kill(_nats_child(server.pid), signal.SIGKILL)
        out, err = run.communicate(timeout=900)
        assert run.returncode == 0, err
    finally:
        server_log = _stop(server)
    assert "nats-server exited; restarting it" in server_log
    assert "starting them here" in err
    progress = [line for line in err.splitlines() if line.startswith("campaign supervised: gen")]
    assert progress and "settled 2 of 2 proposed" in progress[-1], err
    assert "leaderboard: supervised" in out and "finished: budget reached" in out
    assert "leaderboard" not in err

    again, same = _server(home)
    _stop(again)
    assert same == url
    show = ["events", "show", "--home", str(home), "--type", "CampaignFinished", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", *show],
        capture_output=True,
        text=True,
        timeout=120,
    )
    types = [json.loads(line)["type"] for line in done.stdout.splitlines()]
    assert types.count("CampaignFinished") == 1, done.stderr
