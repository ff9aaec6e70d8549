"""The sandbox: a misbehaving child is contained and reported; the parent carries on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from gpu_workers.held_folder import held_folder
from gpu_workers.sandbox import (
    ORPHANED_EXIT,
    Limits,
    SandboxOutcome,
    run_sandboxed,
)

LIMITS = Limits(cpu_seconds=2, address_space_bytes=2 << 30, wall_seconds=3.0)


def probe(what: str, limits: Limits = LIMITS) -> SandboxOutcome:
    with held_folder("kf-sandbox-test-") as workdir:
        return run_sandboxed("tests.sandbox_probes", [what], workdir=workdir, limits=limits)


def test_a_well_behaved_child_runs_in_its_own_temp_dir() -> None:
    with held_folder("kf-sandbox-test-") as workdir:
        outcome = run_sandboxed("tests.sandbox_probes", ["cwd"], workdir=workdir, limits=LIMITS)
        assert outcome.ok
        assert Path(outcome.stdout.strip()).resolve() == workdir.resolve()
    assert not workdir.exists()


def test_the_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_SECRET_TOKEN", "hunter2")
    outcome = probe("env")
    names = set(outcome.stdout.split())
    assert "KF_SECRET_TOKEN" not in names
    assert names <= {
        "PATH",
        "HOME",
        "TMPDIR",
        "PYTHONPATH",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONHASHSEED",
        "OPENBLAS_CORETYPE",
        "LANG",
        "LC_CTYPE",
    }


def test_network_isolation_is_reported_honestly() -> None:
    outcome = probe("net")
    assert outcome.ok
    if outcome.report.network_isolated:
        assert "refused" in outcome.stdout
        assert "unshare" in outcome.report.network_note
    else:
        assert "refused by the host" in outcome.report.network_note


def test_cpu_time_limit_kills_a_spinning_child() -> None:
    outcome = probe("spin", Limits(cpu_seconds=1, address_space_bytes=2 << 30, wall_seconds=20))
    assert outcome.cpu_limit_hit
    assert outcome.signal_name == "SIGXCPU"
    assert not outcome.timed_out
    assert outcome.wall_seconds < 10


def test_wall_clock_timeout_kills_a_sleeping_child() -> None:
    started = time.monotonic()
    outcome = probe("sleep", Limits(cpu_seconds=10, address_space_bytes=2 << 30, wall_seconds=1))
    assert outcome.timed_out
    assert outcome.signal_name == "SIGKILL"
    assert time.monotonic() - started < 60  # the child sleeps an hour; generous for a busy host


def test_address_space_limit_refuses_a_huge_allocation() -> None:
    outcome = probe("memory")
    assert outcome.returncode == 1
    assert "MemoryError" in outcome.stderr


def test_a_segfault_is_reported_as_a_signal() -> None:
    outcome = probe("segv")
    assert outcome.signal_name == "SIGSEGV"
    assert not outcome.ok


def test_exit_zero_is_visible_as_an_exit_status() -> None:
    outcome = probe("exit")
    assert outcome.returncode == 0
    assert outcome.stdout == ""


def test_grandchildren_are_killed_with_the_child() -> None:
    outcome = probe(
        "fork_and_hang", Limits(cpu_seconds=5, address_space_bytes=2 << 30, wall_seconds=1.5)
    )
    assert outcome.timed_out
    grandchild = int(outcome.stdout.split()[0])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{grandchild}/stat").read_text().split(")")[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"grandchild {grandchild} still alive")


def test_the_parent_survives_everything_above() -> None:
    for what in ("segv", "exit", "memory"):
        probe(what)
    assert probe("ok").stdout.strip() == "fine"
    assert os.getpid() > 0


def test_a_child_whose_worker_died_before_it_was_watched_exits_at_once(tmp_path: Path) -> None:
    """The death signal is armed only once the child's interpreter is up; a worker that
    died before then leaves a child no one would stop (a driver waiting for its timed
    window waited for ever). A child whose parent is not the worker that started it
    exits instead of running its module."""
    limits = msgspec.json.encode(LIMITS).decode()
    dead_worker = "1"  # the child's parent is this process, never init
    orphan = subprocess.run(
        [sys.executable, "-m", "gpu_workers.sandbox", dead_worker, limits, "no.such.module"],
        cwd=tmp_path,
        capture_output=True,
    )
    assert orphan.returncode == ORPHANED_EXIT, orphan.stderr
    assert orphan.stdout == b"" and orphan.stderr == b""  # its module was never imported
    assert not (tmp_path / "sandbox.json").exists()
