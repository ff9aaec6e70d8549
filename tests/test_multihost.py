"""The README's multi-host set-up: a hub with TLS and auth, actors elsewhere with creds files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ops.selfsigned import make_tls
from tests.test_swarm import campaign_file, sql

ROLES = ["planner", "kernel-writer", "fuser", "librarian", "verifier", "benchmarker"]


def _start(args: list[str], home: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", *args],
            env={**os.environ, "KF_HOME": str(home)},
            stdout=subprocess.PIPE if args[0] == "server" else out,
            stderr=out,
        )


def _kfactory(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        env={**os.environ, "KF_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=400,
    )


@pytest.mark.slow  # a whole campaign across seven processes: about 60 s
@pytest.mark.timeout(600)
def test_actors_on_other_hosts_run_a_campaign_through_a_tls_hub(tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls")
    hub_home, logs = tmp_path / "hub", tmp_path / "logs"
    logs.mkdir()
    secure = ["--tls-ca", str(tls.ca)]
    server = _start(
        ["server", "--listen", "0.0.0.0", "--tls-cert", str(tls.cert), "--tls-key", str(tls.key),
         *secure],
        hub_home,
        logs / "server.log",
    )  # fmt: skip
    processes: list[subprocess.Popen[bytes]] = [server]
    try:
        assert server.stdout is not None
        url = server.stdout.readline().decode().strip()
        assert url.startswith("nats://"), (logs / "server.log").read_text()
        creds = tmp_path / "handed-out"
        for user in [*ROLES, "cli"]:  # on the hub: one file per role, carried to its host
            made = _kfactory(["creds", user, "-o", str(creds / f"{user}.nk")], hub_home)
            assert made.returncode == 0, made.stderr
        for role in ROLES:  # each "host" has a run folder of its own, without credentials
            host = tmp_path / f"host-{role}"
            processes.append(
                _start(
                    ["actor", role, "--nats", url, "--creds", str(creds / f"{role}.nk"), *secure],
                    host,
                    logs / f"{role}.log",
                )
            )
        run = _kfactory(
            ["run", str(campaign_file(tmp_path, "remote", budget=4, per_generation=4)),
             "--nats", url, "--creds", str(creds / "cli.nk"), *secure, "--json",
             "--no-local-actors"],  # the actors above may still be starting
            tmp_path / "host-cli",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["evaluated"] == 4
        without = _kfactory(["sql", "SELECT 1", "--nats", url, *secure], tmp_path / "stranger")
        assert without.returncode != 0 and "requires credentials" in without.stderr
        counts = {
            row["type"]: row["n"]
            for row in sql(hub_home, "SELECT type, count(*) AS n FROM events GROUP BY type")
        }
        assert "EventRejected" not in counts and "DeadLettered" not in counts, counts
        assert counts["CampaignFinished"] == 1 and counts["BenchmarkCompleted"] >= 1, counts
    finally:
        for process in processes[::-1]:
            process.send_signal(signal.SIGTERM)
        for process in processes[::-1]:
            process.wait(60)
