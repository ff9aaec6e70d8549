"""`kfactory run` ends when its campaign ends: a process that printed its summary exits, and
a SIGINT at any moment (while it starts, while the campaign runs, while it shuts down)
says one line on stderr, never a traceback. The campaign's only kernel passes
verification and then never returns at the timed shape, whose call deadline is a minute
or more, so a benchmark is always in flight when the campaign ends or the signal comes
(issue 35, item 2)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest

from gpu_workers.results import HostCalibration
from tests.cpu_support import PLANTED, calibrated_now

__all__ = ["calibrated_now"]

#: Generous: a loaded 2-core host takes seconds to start and end an interpreter.
EXITS_WITHIN = 5.0
SUMMARY = "finished:"


def _campaign(folder: Path, wall_time: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "hangs.toml"
    path.write_text(
        f"""name = "hangs"
problem = "softmax"
shapes = [[4096, 4096]]

[budget]
candidates = 1
wall_time = "{wall_time}"

[search]
per_generation = 1

[seed]
sources = ["{PLANTED / "hangs_at_4096_squared.c"}"]
"""
    )
    return path


class Lines:
    """A stream's lines as they arrive, each with when it arrived."""

    def __init__(self, stream: object) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, text: str, process: subprocess.Popen[str], within: float) -> float:
        """When the first line holding `text` arrived (waiting `within` s for it)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                if text in line:
                    return at
            assert process.poll() is None or self._thread.is_alive(), f"ended before {text!r}"
            time.sleep(0.02)
        raise AssertionError(f"no {text!r} within {within} s: {self.lines}")

    def after(self, moment: float) -> list[str]:
        self._thread.join(timeout=5)
        return [line for at, line in self.lines if at >= moment]


def _start(campaign: Path, home: Path) -> tuple[subprocess.Popen[str], Lines, Lines]:
    process = subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "run", str(campaign), "--home", str(home)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    return process, Lines(process.stdout), Lines(process.stderr)


def _verified(home: Path) -> int:
    with duckdb.connect(str(home / "events.duckdb"), read_only=True) as db:
        row = db.execute("SELECT count(*) FROM events WHERE type = 'KernelVerified'").fetchone()
    assert row is not None
    return int(row[0])


def test_a_campaign_that_reached_its_wall_time_exits_after_its_summary(
    tmp_path: Path, calibrated_now: HostCalibration
) -> None:
    # Long enough for the verification on a loaded host (the host is calibrated: the
    # campaign does not wait for that); the benchmark outlasts it
    process, out, err = _start(_campaign(tmp_path, "20s"), tmp_path / "home")
    try:
        printed = out.wait_for(SUMMARY, process, within=240)
        process.wait(timeout=60)
        exited = time.monotonic()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stderr = "\n".join(err.after(0))
    assert exited - printed < EXITS_WITHIN, f"exited {exited - printed:.1f} s after: {stderr}"
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr and "asynchronous generator" not in stderr, stderr
    assert _verified(tmp_path / "home") == 1  # the kernel was being timed as the campaign ended
    assert any("finished: budget reached: wall time" in line for line in out.after(0))


def _stopped_in_one_line(process: subprocess.Popen[str], err: Lines) -> None:
    signalled = time.monotonic()
    process.send_signal(signal.SIGINT)
    process.wait(timeout=30)
    said = err.after(signalled)
    assert time.monotonic() - signalled < 30
    # 130 when the command was stopped; 0 when it had finished; the signal's own status
    # when it came after the command, as the interpreter ended (the default action)
    assert process.returncode in (0, 130, -signal.SIGINT), said
    assert len(said) <= 1, "\n".join(said)
    assert not any("Traceback" in line or "Error" in line for line in said), said
    if process.returncode == 130:  # how to resume, and how to get an answer meanwhile
        assert any("resume" in line and "--final-run" in line for line in said), said


def test_a_sigint_while_it_starts_says_one_line(tmp_path: Path) -> None:
    process, _, err = _start(_campaign(tmp_path, "60s"), tmp_path / "home")
    try:
        err.wait_for("hub nats://", process, within=120)
        _stopped_in_one_line(process, err)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("moment", ["while timing", "while shutting down"])
def test_a_sigint_later_says_one_line(
    tmp_path: Path, moment: str, calibrated_now: HostCalibration
) -> None:
    # "while timing" waits for the verification, which a recalibration would hold up
    wall_time = "60s" if moment == "while timing" else "8s"
    home = tmp_path / "home"
    process, out, err = _start(_campaign(tmp_path, wall_time), home)
    try:
        if moment == "while timing":
            deadline = time.monotonic() + 120
            while not (home / "events.duckdb").exists() or _verified_now(home) == 0:
                alive = time.monotonic() < deadline and process.poll() is None
                assert alive, (out.after(0), err.after(0))  # read only on failure
                time.sleep(0.5)
        else:
            out.wait_for(SUMMARY, process, within=240)
        _stopped_in_one_line(process, err)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _verified_now(home: Path) -> int:
    """The verified count while the recorder holds the store: read through the server."""
    answer = subprocess.run(
        [
            sys.executable,
            "-m",
            "ops.cli",
            "sql",
            "SELECT count(*) AS n FROM events WHERE type = 'KernelVerified'",
            "--home",
            str(home),
            "--format",
            "csv",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = answer.stdout.split()
    return int(lines[-1]) if answer.returncode == 0 and lines and lines[-1].isdigit() else 0
