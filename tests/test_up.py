"""`kfactory up` runs a supervised swarm against the embedded hub; a killed actor is
started again; `kfactory down` stops everything and leaves no process behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from ops.cli import main
from ops.supervisor import SwarmState, read_state, running

SWARM = """
[[actor]]
role = "verifier"
count = 2
target = "cpu"
"""


def _kfactory(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str]:
    """Run a command in this process (the swarm's own processes are children): status
    and stderr."""
    capsys.readouterr()
    status = main([*args, "--home", str(home)])
    return status, capsys.readouterr().err


def _wait_for(home: Path, ok: object, what: str, timeout: float = 120.0) -> SwarmState:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = read_state(home)
        if state is not None and ok(state):  # type: ignore[operator]
            return state
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout:.0f} s: {read_state(home)}")


@pytest.mark.timeout(400)
def test_up_restarts_a_killed_actor_and_down_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    config = tmp_path / "swarm.toml"
    config.write_text(SWARM)
    status, err = _kfactory(capsys, home, "up", "--config", str(config), "--detach")
    assert status == 0, err
    state = read_state(home)
    assert state is not None and state.ready and running(state.pid)
    names = [p.name for p in state.processes]
    assert names == ["hub", "verifier-cpu-1", "verifier-cpu-2"]
    pids = {p.name: p.pid for p in state.processes}
    assert all(pid is not None and running(pid) for pid in pids.values())
    everyone = {state.pid, *(pid for pid in pids.values() if pid is not None)}
    try:
        status, err = _kfactory(capsys, home, "up", "--config", str(config), "--detach")
        assert status == 2 and "already runs" in err

        victim = pids["verifier-cpu-1"]
        assert victim is not None
        os.kill(victim, signal.SIGKILL)

        def restarted(s: SwarmState) -> bool:
            slot = next(p for p in s.processes if p.name == "verifier-cpu-1")
            return slot.restarts == 1 and slot.pid not in (None, victim)

        state = _wait_for(home, restarted, "the killed verifier started again")
        replacement = next(p.pid for p in state.processes if p.name == "verifier-cpu-1")
        assert replacement is not None and running(replacement)
        everyone.add(replacement)
        log = (home / "swarm" / "up.log").read_text()
        assert "exited; starting it again" in log and "signal 9" in log
        untouched = next(p for p in state.processes if p.name == "verifier-cpu-2")
        assert untouched.pid == pids["verifier-cpu-2"] and untouched.restarts == 0
    finally:
        status, err = _kfactory(capsys, home, "down")
    assert status == 0 and "stopped 3 processes" in err, err
    assert not (home / "swarm" / "state.json").exists()
    left = [pid for pid in everyone if running(pid)]
    assert left == [], f"still running: {left}"
    assert _kfactory(capsys, home, "down") == (0, f"kfactory down: no swarm in {home}\n")
