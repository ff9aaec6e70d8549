"""The supervisor of `kfactory up`: a process that keeps exiting is started again after
ever longer delays, each exit logged; one that has run long enough starts over."""

from __future__ import annotations

import itertools
import shutil
import time
from pathlib import Path

import structlog

from ops import supervisor
from ops.supervisor import FIRST_DELAY, Child, Supervisor, read_state

STARTS: list[float] = []


class Counted(Child):
    def start(self, url: str | None) -> None:
        STARTS.append(time.monotonic())
        super().start(url)


def test_a_process_that_keeps_exiting_is_started_again_with_doubling_delays(
    tmp_path: Path,
) -> None:
    STARTS.clear()
    false = shutil.which("false")
    assert false is not None
    child = Counted("crasher", lambda _url: [false], tmp_path / "crasher.log")
    running = Supervisor(tmp_path, tmp_path / "swarm.toml", None, [child], url="nats://x:1")
    deadline = time.monotonic() + 7 * FIRST_DELAY  # starts at 0, 0.5, 1.5 and 3.5 s
    with structlog.testing.capture_logs() as logs:
        running.run(lambda: time.monotonic() > deadline)
    gaps = [later - earlier for earlier, later in itertools.pairwise(STARTS)]
    assert len(STARTS) >= 3, STARTS
    for index, gap in enumerate(gaps):  # at least 0.5, 1, 2 s apart: never sooner
        assert gap >= FIRST_DELAY * 2**index - 0.01, gaps
    exits = [e for e in logs if e["event"] == "exited; starting it again"]
    assert [e["in_s"] for e in exits][:3] == [0.5, 1.0, 2.0][: len(exits)]
    assert all(e["status"] == 1 and e["process"] == "crasher" for e in exits)
    assert read_state(tmp_path) is None  # stopped: the state is gone


def test_a_process_that_ran_long_enough_starts_over_at_the_first_delay(tmp_path: Path) -> None:
    child = Child("steady", lambda _url: ["true"], tmp_path / "steady.log", delay=16.0)
    child.start(None)
    assert child.process is not None
    child.process.wait()
    child.started_at -= supervisor.STABLE_AFTER  # as if it had run that long
    assert child.reap(time.monotonic())
    assert child.due - time.monotonic() <= FIRST_DELAY
    assert child.delay == 2 * FIRST_DELAY
