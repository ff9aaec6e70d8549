"""A problem the package has never seen, written only in a test's temp dir, searched from
the user's own files: a jinja2 template, a Kernel-Tuner-style macro kernel, a seed kernel
alone (the generic space), and the LLM writer from a blank page.

Each is a real campaign of two candidates (its own nats-server, recorder and actors): tens
of seconds on a quiet host, minutes when other benchmarks hold the host-wide timing lock,
so they run with `make test-slow`; tests/test_user_space_units.py covers the same paths
without a campaign."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_openai import FakeOpenAI, Reply
from tests.test_swarm import sql

pytestmark = pytest.mark.slow

PROBLEM = """
import numpy as np
from kernels.spec import Arg, Cost, Problem
from kernels.user_spaces import KernelSpace


def _l2norm(a):
    x = a["x"].astype(np.float64)
    return {"y": x / np.sqrt((x * x).sum(axis=1, keepdims=True) + 1e-12)}


def _numpy(a):
    x = a["x"]
    return {"y": x / np.sqrt((x * x).sum(axis=1, keepdims=True) + np.float32(1e-12))}


L2NORM = Problem(
    name="l2norm_rows",
    description="each row divided by its L2 norm",
    dims=("rows", "cols"),
    args=(Arg("x", ("rows", "cols")), Arg("y", ("rows", "cols"), output=True)),
    reference=_l2norm,
    baseline=_numpy,
    test_shapes=({"rows": 3, "cols": 37}, {"rows": 1, "cols": 1}, {"rows": 5, "cols": 64}),
    default_shape={"rows": 64, "cols": 512},
    cost=lambda s: Cost(bytes_moved=8 * s["rows"] * s["cols"], flops=3 * s["rows"] * s["cols"]),
)

SPACES = SPACES_HERE
"""

JINJA = """\
#include <math.h>
#include <stdint.h>
/* {{ template }}: unroll {{ unroll }} */
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        double s = 0.0;
#pragma GCC unroll {{ unroll }}
        for (int64_t j = 0; j < cols; ++j) s += (double)xr[j] * xr[j];
        const float inv = (float)(1.0 / sqrt(s + 1e-12));
        for (int64_t j = 0; j < cols; ++j) yr[j] = xr[j] * inv;
    }
}
"""

MACRO = """\
#include <math.h>
#include <stdint.h>
#ifndef BLOCK
#define BLOCK 4
#endif
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        double part[BLOCK] = {0};
        int64_t j = 0;
        for (; j + BLOCK <= cols; j += BLOCK)
            for (int k = 0; k < BLOCK; ++k) part[k] += (double)xr[j + k] * xr[j + k];
        double s = 0.0;
        for (; j < cols; ++j) s += (double)xr[j] * xr[j];
        for (int k = 0; k < BLOCK; ++k) s += part[k];
        const float inv = (float)(1.0 / sqrt(s + 1e-12));
        for (j = 0; j < cols; ++j) yr[j] = xr[j] * inv;
    }
}
"""

SEED = """\
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for
    for (int64_t r = 0; r < rows; ++r) {
        double s = 0.0;
        for (int64_t j = 0; j < cols; ++j) s += (double)x[r * cols + j] * x[r * cols + j];
        const float inv = (float)(1.0 / sqrt(s + 1e-12));
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = x[r * cols + j] * inv;
    }
}
"""

CAMPAIGN = """\
name = "{name}"
problem = "{problem}"
shapes = [[64, 512]]
[budget]
candidates = {budget}
wall_time = "5m"
stop_at_roofline = 1.5
[search]
per_generation = {budget}
seed = 3
"""


def _write_problem(folder: Path, spaces: str = "[]") -> str:
    (folder / "l2.py").write_text(PROBLEM.replace("SPACES_HERE", spaces))
    return f"{folder / 'l2.py'}:L2NORM"


def _run(tmp_path: Path, campaign: str, *extra: str, env: dict[str, str] | None = None) -> dict:
    path = tmp_path / "campaign.toml"
    path.write_text(campaign)
    home = str(tmp_path / "home")
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", "run", str(path), *extra, "--json", "--home", home],
        capture_output=True,
        text=True,
        timeout=400,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )
    assert done.returncode == 0, done.stderr
    outcome: dict = json.loads(done.stdout)
    return outcome


def _base(row: dict[str, object]) -> str:
    """A user template's name without the digest of its file's text."""
    return str(row["template"]).split("@")[0]


def _verified(home: Path) -> list[dict[str, object]]:
    """Each verified kernel's template, params and flags (as the writer recorded them)."""
    return sql(
        home,
        "SELECT w.payload->>'template' AS template, w.payload->'params' AS params, "
        "w.payload->'flags' AS flags, w.payload->>'writer' AS writer, "
        "w.payload->>'source' AS source FROM events v JOIN events w "
        "ON v.payload->>'candidate_id' = w.payload->>'candidate_id' "
        "WHERE v.type = 'KernelVerified' AND w.type = 'KernelWritten'",
    )


def test_a_jinja_template_next_to_the_problem_file_is_searched(tmp_path: Path) -> None:
    (tmp_path / "l2_rows.c.j2").write_text(JINJA)
    spaces = (
        '[KernelSpace("l2_rows.c.j2", {"unroll": [1, 2, 4, 8], '
        '"flags": ["-O2", "-O3 -march=native"]}, restrictions=["unroll <= 4"])]'
    )
    problem = _write_problem(tmp_path, spaces)
    outcome = _run(tmp_path, CAMPAIGN.format(name="jinja", problem=problem, budget=2))
    assert outcome["evaluated"] == 2
    verified = _verified(tmp_path / "home")
    assert verified and {_base(row) for row in verified} == {"l2_rows"}
    for row in verified:
        unroll = json.loads(str(row["params"]))["unroll"]
        assert unroll <= 4  # the restriction held
        assert f"#pragma GCC unroll {unroll}" in str(row["source"])


def test_a_kernel_tuner_macro_kernel_in_the_campaign_file_is_searched(tmp_path: Path) -> None:
    (tmp_path / "l2_macro.c").write_text(MACRO)
    problem = _write_problem(tmp_path)
    campaign = CAMPAIGN.format(name="macro", problem=problem, budget=2) + (
        '[[spaces]]\nfile = "l2_macro.c"\n'
        "params = { BLOCK = [2, 4, 8, 16], UNROLL = [1, 2, 4] }\n"
        'restrictions = ["BLOCK * UNROLL <= 16"]\n'
    )
    outcome = _run(tmp_path, campaign)
    assert outcome["evaluated"] == 2
    verified = _verified(tmp_path / "home")
    assert verified and {_base(row) for row in verified} == {"l2_macro"}
    for row in verified:
        params = json.loads(str(row["params"]))
        assert params["BLOCK"] * params["UNROLL"] <= 16
        assert f"-DBLOCK={params['BLOCK']}" in json.loads(str(row["flags"]))
        assert row["source"] == MACRO  # the user's kernel, unchanged


def test_a_seed_kernel_alone_is_tuned_in_the_generic_space(tmp_path: Path) -> None:
    (tmp_path / "seed.c").write_text(SEED)
    problem = _write_problem(tmp_path)
    outcome = _run(
        tmp_path,
        CAMPAIGN.format(name="seed", problem=problem, budget=2),
        "--seed-source",
        str(tmp_path / "seed.c"),
    )
    assert outcome["evaluated"] == 2
    written = sql(
        tmp_path / "home",
        "SELECT payload->'params' AS params, payload->>'source' AS source, "
        "payload->>'candidate_id' AS c FROM events WHERE type = 'KernelWritten' "
        "ORDER BY payload->>'candidate_id'",
    )
    first = json.loads(str(written[0]["params"]))
    assert first == {"flags": "-O3", "vector_width": 0, "threads": 0, "schedule": "as_written"}
    assert written[0]["source"] == SEED  # generation 0 starts from the seed as it is
    verified = _verified(tmp_path / "home")
    assert len(verified) == 2 and {_base(row) for row in verified} == {"seed_seed"}
    assert len({str(row["params"]) for row in verified}) == len(verified)


def test_the_llm_writes_generation_0_from_a_blank_page(tmp_path: Path) -> None:
    problem = _write_problem(tmp_path)
    script = [Reply(f"A row loop.\n\n```c\n// kfactory-flags: -O3\n{SEED}```\n")] * 2
    campaign = CAMPAIGN.format(name="blank", problem=problem, budget=2) + (
        '[writer]\nkind = "llm"\nbase_url = "{url}"\nmodel = "fake-coder"\n'
        'api_key_env = "KF_TEST_KEY"\ntimeout_s = 5.0\nattempts = 2\nbackoff_s = 0.1\n'
    )
    with FakeOpenAI(script) as server:
        outcome = _run(
            tmp_path,
            campaign.replace("{url}", server.base_url),
            env={"KF_TEST_KEY": "not-a-secret"},
        )
        requests = list(server.requests)
    assert outcome["evaluated"] >= 1
    prompt = json.dumps(requests[0]["messages"])
    assert "No kernel has been written for this problem yet" in prompt
    assert "_l2norm" in prompt  # the reference's own source
    assert "bytes moved" in prompt
    verified = _verified(tmp_path / "home")
    assert verified and {row["writer"] for row in verified} == {"llm"}
