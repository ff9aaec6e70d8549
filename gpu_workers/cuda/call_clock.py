"""When the CUDA runner's current timed call began, as its worker sees it, and the worker's
side of the call deadline (`gpu_workers.deadlines`).

The runner holds the kernel itself: a launched kernel that never ends can only be stopped
by ending the runner's process (its CUDA context goes with it). The runner checks each
timed call against its deadline while it waits on the call's end event and ends itself
past it (`driver.Timer`); a runner whose host thread is stuck cannot. So before each call
the runner stamps its start in a small mapped file (CLOCK_MONOTONIC is system-wide) and
clears it after, and the worker's watch (`deadline_watch`, polled by `run_sandboxed`)
kills the runner once a call has run past its deadline and a grace: the kernel is then
rejected as `timeout`, as the runner's own check would have.
"""

from __future__ import annotations

import mmap
import struct
import time
from collections.abc import Callable
from pathlib import Path

from gpu_workers.results import Rejection

CALL_CLOCK_FILE = "call_clock.bin"
GRACE_SECONDS = 5.0
"""How long past its deadline a call may run before the worker kills the runner: the
runner's own check fires at the deadline and needs only to write its reply and exit."""
_STAMP = struct.Struct("<d")
DERIVED = "derived from the kernel's verification pace and the problem's cost"


class CallClock:
    """The runner's side: the start of the call in progress (0.0 between calls)."""

    def __init__(self, path: Path = Path(CALL_CLOCK_FILE)) -> None:
        path.write_bytes(bytes(_STAMP.size))
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), _STAMP.size)

    def started(self) -> None:
        _STAMP.pack_into(self._map, 0, time.monotonic())

    def ended(self) -> None:
        _STAMP.pack_into(self._map, 0, 0.0)


def call_started(workdir: Path) -> float | None:
    """When the runner's current call began (time.monotonic); None between calls."""
    try:
        data = (workdir / CALL_CLOCK_FILE).read_bytes()
    except FileNotFoundError:
        return None
    if len(data) != _STAMP.size:
        return None
    started = float(_STAMP.unpack(data)[0])
    return started if started > 0.0 else None


class CallOverran(Exception):
    """The runner's current call ran past its deadline and the grace: the runner is killed."""

    def __init__(self, running_s: float, limit_s: float) -> None:
        super().__init__(f"a timed call still running after {running_s:.3g} s")
        self.running_s = running_s
        self.limit_s = limit_s

    def rejection(self, progress: str) -> Rejection:
        return Rejection(
            stage="benchmark",
            reason="timeout",
            message=(
                f"a timed call took longer than its {self.limit_s:.3g} s deadline ({DERIVED}); "
                f"still running after {self.running_s:.3g} s, its runner was killed, "
                f"during {progress}"
            ),
            evidence={
                "progress": progress,
                "call_limit_seconds": f"{self.limit_s:.3g}",
                "running_seconds": f"{self.running_s:.3g}",
            },
        )


def deadline_watch(
    workdir: Path, limit_s: float, grace_s: float = GRACE_SECONDS
) -> Callable[[], None]:
    """A `run_sandboxed` watch: raises CallOverran once the runner's current call has run
    longer than `limit_s` + `grace_s`."""

    def watch() -> None:
        started = call_started(workdir)
        if started is None:
            return
        running = time.monotonic() - started
        if running > limit_s + grace_s:
            raise CallOverran(running, limit_s)

    return watch
