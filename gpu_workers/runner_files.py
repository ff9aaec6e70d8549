"""The files a worker and its sandboxed runner exchange, on every device.

The worker writes REQUEST_FILE (a job) and the input arrays into the sandbox dir; the
runner writes PROGRESS_FILE before each step that may fail (so a failure can be pinned
to a trial and a call), the output arrays, and last RESULT_FILE (its reply). Each back
end's `protocol` module defines its own jobs and replies around these.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from gpu_workers.results import Mechanism, Rejection

REQUEST_FILE = "request.json"
RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.txt"
NO_PROGRESS = "before the first kernel call"
"""What `read_progress` says when the runner never wrote the progress file."""

ReplyT = TypeVar("ReplyT")


class RunRecord(msgspec.Struct, frozen=True, kw_only=True):
    trial: int
    run: int
    damaged_slack: list[str]
    seconds: float


class VerifyReply(msgspec.Struct, frozen=True, kw_only=True, tag="verify"):
    runs: list[RunRecord]
    ended: Rejection | None = None
    """Why the kernel's process ended before every run was made (CPU target), or None."""
    mechanisms: list[Mechanism] = []
    """How the kernel's own process was contained (CPU target)."""


def out_file(trial: int, run: int, name: str) -> str:
    return f"t{trial}_r{run}_out_{name}.npy"


def after_file(trial: int, run: int, name: str) -> str:
    return f"t{trial}_r{run}_in_{name}.npy"


def input_file(trial: int, name: str) -> str:
    return f"t{trial}_in_{name}.npy"


def timed_out_file(seed_index: int, name: str) -> str:
    return f"timed_{seed_index}_{name}.npy"


def recheck_file(name: str) -> str:
    return f"recheck_{name}.npy"


def write_request(workdir: Path, job: msgspec.Struct) -> None:
    (workdir / REQUEST_FILE).write_bytes(msgspec.json.encode(job))


def read_reply(workdir: Path, replies: Any) -> Any:
    """The runner's reply decoded as `replies` (a back end's Reply union); None when it
    wrote none or an unreadable one."""
    try:
        return msgspec.json.decode((workdir / RESULT_FILE).read_bytes(), type=replies)
    except (OSError, msgspec.DecodeError):
        return None


def expect_reply(workdir: Path, replies: Any, kind: type[ReplyT]) -> ReplyT:
    """The reply of a run that finished, which must be a `kind`."""
    reply = read_reply(workdir, replies)
    if not isinstance(reply, kind):
        raise RuntimeError(
            f"the runner answered with {type(reply).__name__}, not {kind.__name__}"
            if reply is not None
            else f"the runner left no readable {RESULT_FILE}"
        )
    return reply


def write_progress(text: str) -> None:
    """The step the runner is about to take (in its working directory)."""
    Path(PROGRESS_FILE).write_text(text)


WINDOW_CLOSED_FILE = "window-closed"
"""Left by a timing runner once its timed window (warm-up and timed rounds) is over: what
follows (judging, the re-check) need not hold the device alone."""


WINDOW_READY_FILE = "window-ready"
"""Left by a timing runner once it is set up (kernels loaded, inputs written): it waits
for WINDOW_OPEN_FILE, which its caller leaves once the device is held alone for it."""
WINDOW_OPEN_FILE = "window-open"
WINDOW_POLL_SECONDS = 0.001


def wait_for_window() -> None:
    """Say the run is ready to time, and wait until the device is held for it."""
    Path(WINDOW_READY_FILE).touch()
    while not Path(WINDOW_OPEN_FILE).is_file():
        time.sleep(WINDOW_POLL_SECONDS)


def window_ready(workdir: Path) -> bool:
    return (workdir / WINDOW_READY_FILE).is_file()


def open_window(workdir: Path) -> None:
    (workdir / WINDOW_OPEN_FILE).touch()


def close_window() -> None:
    Path(WINDOW_CLOSED_FILE).touch()


def window_closed(workdir: Path) -> bool:
    return (workdir / WINDOW_CLOSED_FILE).is_file()


def read_progress(workdir: Path) -> str:
    """The last step the runner reported, or NO_PROGRESS."""
    try:
        return (workdir / PROGRESS_FILE).read_text()
    except OSError:
        return NO_PROGRESS
