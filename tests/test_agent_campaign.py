"""The agent operator inside real evolve campaigns (`kfactory run`: its own nats-server,
recorder, DuckDB store and actors), against a scripted OpenAI-compatible server over a
real socket: the agent's submission is verified and timed by the swarm like any child,
and its trail is in the `agent_steps` view; with the endpoint down, the agent's variation
is a write-stage rejection and the campaign finishes with the offline operators'
children."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.evolve_history import SEED, write_problem
from tests.fake_openai import FakeOpenAI, ToolCalls
from tests.test_swarm import sql

CAMPAIGN = """
name = "{name}"
problem = "{problem}"
shapes = [[64, 512]]
[budget]
candidates = 4
wall_time = "5m"
[search]
per_generation = 3
[seed]
sources = ["{seed}"]
[writer]
kind = "evolve"
base_url = "{base_url}"
model = "fake-agent"
timeout_s = 10.0
attempts = 1
backoff_s = 0.1
[writer.agent]
max_steps = 4
wall_time = "90s"
"""

CHILD = SEED.replace("* 0.5f + 1.0f;", "* 0.5f + 1.0f; /* the agent's */")


def _run(folder: Path, name: str, base_url: str) -> tuple[Path, dict[str, Any]]:
    problem, seed = write_problem(folder)
    path = folder / "campaign.toml"
    path.write_text(CAMPAIGN.format(name=name, problem=problem, seed=seed, base_url=base_url))
    home = folder / "home"
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", "run", str(path), "--home", str(home), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return home, json.loads(done.stdout)


def test_the_agents_child_is_verified_and_timed_and_its_trail_is_queryable(
    tmp_path: Path,
) -> None:
    script = [
        ToolCalls((("compile", {"source": CHILD}),)),
        ToolCalls((("verify", {"source": CHILD}),)),
        ToolCalls((("submit", {"source": CHILD, "flags": ["-O3"]}),)),
    ]
    with FakeOpenAI(script) as server:
        home, result = _run(tmp_path, "agent-e2e", server.base_url)
        requests = list(server.requests)
    assert result["finished"].startswith("budget reached")
    assert len(requests) == 3 and server.unscripted == 0

    (child,) = sql(
        home,
        "SELECT candidate_id, operator, writer, parents[1] AS parent, len(parents) AS n, "
        "status, median_ns, diff FROM lineage "
        "WHERE operator = 'agent'",
    )
    assert (child["writer"], child["status"]) == ("agent", "benchmarked")
    assert (child["parent"], child["n"]) == ("agent-e2e:g0:c0", 1)
    assert child["median_ns"] and "/* the agent's */" in str(child["diff"])
    steps = sql(
        home,
        "SELECT step, kind, tool, result FROM agent_steps "
        f"WHERE candidate_id = '{child['candidate_id']}' ORDER BY position",
    )
    assert [(s["step"], s["kind"], s["tool"]) for s in steps] == [
        (1, "reply", ""),
        (1, "tool", "compile"),
        (2, "reply", ""),
        (2, "tool", "verify"),
        (3, "reply", ""),
        (3, "tool", "submit"),
    ]
    assert steps[1]["result"] == "OK: compiled, static passed"
    assert str(steps[3]["result"]).startswith("VERIFIED")
    # the verifier's own verdict and the benchmarker's own time are the evidence
    judged = sql(
        home,
        "SELECT type FROM events WHERE payload->>'candidate_id' = "
        f"'{child['candidate_id']}' AND type IN ('KernelVerified', 'BenchmarkCompleted')",
    )
    assert sorted(str(r["type"]) for r in judged) == ["BenchmarkCompleted", "KernelVerified"]


def test_with_the_endpoint_down_the_campaign_goes_on_with_the_offline_operators(
    tmp_path: Path,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home, result = _run(tmp_path, "agent-down", f"http://127.0.0.1:{port}/v1")
    assert result["finished"].startswith("budget reached")
    rows = sql(home, "SELECT operator, writer, status, rejected_reason FROM lineage")
    agent = [r for r in rows if r["operator"] == "agent"]
    assert [(r["status"], r["rejected_reason"]) for r in agent] == [("rejected", "agent_failed")]
    (rejection,) = sql(home, "SELECT stage, message FROM rejections WHERE operator = 'agent'")
    assert rejection["stage"] == "write"
    assert str(rejection["message"]).startswith("endpoint: endpoint unreachable after 1 attempts")
    assert any(r["writer"] == "operator" and r["status"] == "benchmarked" for r in rows)
    (gave_up,) = sql(home, "SELECT kind, content FROM agent_steps")
    assert gave_up["kind"] == "gave_up" and gave_up["content"] == rejection["message"]
