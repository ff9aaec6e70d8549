"""The LLM writer inside a campaign, against a local server that speaks the OpenAI chat
API over a real socket (through the real `openai` SDK)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kernels.templates import example_kernel
from tests.fake_openai import Delay, FakeOpenAI, HttpError, Reply
from tests.test_swarm import sql

CAMPAIGN = """
name = "llm"
problem = "softmax"
target = "cpu"
shapes = [[256, 1024]]
[budget]
candidates = 5
wall_time = "10m"
stop_at_roofline = 1.5
[search]
per_generation = 2
seed = 5
[writer]
kind = "llm"
base_url = "{base_url}"
model = "fake-coder"
api_key_env = "KF_TEST_KEY"
timeout_s = 5.0
attempts = 3
backoff_s = 0.1
"""


def fenced(source: str, note: str) -> str:
    return f"Here is the kernel ({note}).\n\n```c\n// {note}\n{source}```\n"


def test_llm_variations_are_verified_fixed_retried_and_recorded(tmp_path: Path) -> None:
    example = example_kernel("softmax")
    assert example is not None
    flags = "// kfactory-flags: " + " ".join(example.flags) + "\n"
    good = flags + example.source
    broken = good + "\nthis line is not C;\n"
    script = [
        Reply(fenced(good, "improved")),  # generation 1: improve(seed)
        Reply(fenced(broken, "broken")),  # generation 1: improve again -> fails to compile
        HttpError(500),  # generation 2: fix(broken): an API error, retried...
        Reply(fenced(good, "fixed")),  # ... and answered
        Delay(60.0),  # generation 2: another variation times out, retried...
        Reply(fenced(good, "again")),  # ... and answered
    ]
    with FakeOpenAI(script) as server:
        path = tmp_path / "llm.toml"
        path.write_text(CAMPAIGN.format(base_url=server.base_url))
        home = tmp_path / "home"
        done = subprocess.run(
            [sys.executable, "-m", "ops.cli", "run", str(path), "--home", str(home), "--json"],
            capture_output=True,
            text=True,
            timeout=400,
            env={"KF_TEST_KEY": "not-a-secret", "PATH": "/usr/bin:/bin"},
        )
        requests = list(server.requests)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["evaluated"] >= 5

    exchanges = sql(
        home,
        "SELECT payload->>'operator' AS op, payload->>'attempts' AS attempts, "
        "payload->>'error' AS error, payload->>'candidate_id' AS candidate, "
        "payload->'prompt' AS prompt FROM events WHERE type = 'LlmExchanged' ORDER BY position",
    )
    # softmax has one template: generation 0 is its one seed (so 4 variations fill the
    # budget of 5), the archive starts with one elite and generation 1 improves it twice
    # (crossover, which needs two, is tested in test_llm_archive.py)
    assert [row["op"] for row in exchanges][:3] == ["improve", "improve", "fix"]
    assert [row["attempts"] for row in exchanges] == ["1", "1", "2", "2"]

    verified_llm = sql(
        home,
        "SELECT count(*) AS n FROM events v JOIN events w "
        "ON v.payload->>'candidate_id' = w.payload->>'candidate_id' "
        "WHERE v.type = 'KernelVerified' AND w.type = 'KernelWritten' "
        "AND w.payload->>'writer' = 'llm'",
    )
    assert int(verified_llm[0]["n"]) >= 1  # type: ignore[call-overload]

    compile_errors = sql(
        home,
        "SELECT payload->'evidence'->>'log' AS log, payload->>'candidate_id' AS c "
        "FROM events WHERE type = 'KernelRejected' AND payload->>'stage' = 'compile'",
    )
    assert len(compile_errors) == 1
    error_line = next(
        line for line in str(compile_errors[0]["log"]).splitlines() if "error" in line
    )
    fix_prompt = json.dumps(json.loads(str(exchanges[2]["prompt"])))
    assert error_line.strip() in json.loads(fix_prompt)[1]["content"]
    fix_request = json.dumps(requests[2]["messages"])  # what the server actually received
    assert "this line is not C" in fix_request
