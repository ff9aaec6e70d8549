"""A cuda campaign on a host without a GPU: compiled and checked here, never run or faked."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actors.campaign.campaign_file import CampaignError, CampaignSpec, Writer, validate
from actors.search.spaces import design_spaces
from gpu_workers.targets import device_missing
from kernels.loading import load_problem
from ops.gpu_check_cmd import CHECKS
from tests.test_swarm import kfactory, sql

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
no_gpu = pytest.mark.skipif(
    device_missing("cuda") is None, reason="this host has a GPU: the cuda roles run here"
)


def test_campaign_dtypes_must_suit_the_target() -> None:
    assert validate(CampaignSpec(problem="softmax", target="cuda", dtype="bf16")).dtype == "bf16"
    with pytest.raises(CampaignError, match="cpu kernels take \\['fp32'\\]"):
        validate(CampaignSpec(problem="softmax", target="cpu", dtype="bf16"))
    with pytest.raises(CampaignError, match="target 'tpu' is unknown"):
        validate(CampaignSpec(problem="softmax", target="tpu"))
    llm = Writer(kind="llm", base_url="http://127.0.0.1:9", model="m")
    with pytest.raises(CampaignError, match="writes cpu kernels only so far"):
        validate(CampaignSpec(problem="softmax", target="cuda", writer=llm))


@no_gpu
def test_a_device_role_for_cuda_refuses_to_start_without_a_gpu(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", "actor", "verifier", "--target", "cuda"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "a verifier for cuda needs the device here" in done.stderr
    assert str(device_missing("cuda")) in done.stderr


@needs_nvcc
@no_gpu
def test_kernels_are_compiled_and_checked_then_wait_for_a_gpu(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run = kfactory(
        "run",
        "--problem",
        "softmax",
        "--target",
        "cuda",
        "--dtype",
        "bf16",
        "--budget",
        "4",
        "--per-generation",
        "4",
        "--home",
        str(home),
    )
    query = (
        "SELECT type, count(*) AS n FROM events WHERE type IN "
        "('KernelWritten', 'KernelCompiled', 'KernelRejected', 'KernelVerified') GROUP BY type"
    )
    deadline = time.monotonic() + 240
    counts: dict[str, int] = {}
    try:
        while time.monotonic() < deadline:
            time.sleep(2)
            if not (home / "server.json").exists():
                continue
            counts = {str(r["type"]): int(str(r["n"])) for r in sql(home, query)}
            if counts.get("KernelCompiled", 0) + counts.get("KernelRejected", 0) >= 4:
                break
        compiled = sql(
            home,
            "SELECT payload->>'arch' AS arch, payload->'resources' AS resources, "
            "payload->>'dtype' AS dtype FROM events WHERE type = 'KernelCompiled'",
        )
    finally:
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    assert counts.get("KernelWritten") == 4, counts
    assert counts.get("KernelCompiled", 0) + counts.get("KernelRejected", 0) == 4, counts
    assert "KernelVerified" not in counts, "nothing may pass the run stage without a GPU"
    assert compiled, "no candidate passed the compile and static stages"
    for row in compiled:
        assert row["arch"] == "sm_90" and row["dtype"] == "bf16"
        resources = json.loads(str(row["resources"]))
        assert isinstance(resources, list) and resources
        assert all(r["registers"] > 0 and r["spill_store_bytes"] == 0 for r in resources)
    assert "kfactory actor verifier --target cuda" in err
    assert run.returncode == 130, err


def test_every_gpu_check_campaign_is_valid_without_running_it() -> None:
    for problem, dtype, shape in CHECKS:
        loaded = load_problem(problem)
        assert dtype in loaded.dtypes
        assert not shape or len(shape) == len(loaded.dims), (problem, shape, loaded.dims)
        validate(CampaignSpec(problem=problem, target="cuda", dtype=dtype))
        assert any(t.accepts(dtype) for t in design_spaces(problem, "cuda", dtype))


@no_gpu
def test_gpu_check_without_a_gpu_says_why_and_runs_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ops.cli", "gpu-check", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"no GPU to check here: {device_missing('cuda')}" in done.stderr
    assert not (tmp_path / "out").exists()
