"""What a test session shares across its pytest-xdist workers: a folder all of them see,
and a lock so that one worker builds a shared thing (a recorded campaign, a calibration)
while the others wait for it, rather than each building its own."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """`name` in the session's base folder: the one of the whole run, not a worker's own
    (under xdist each worker's base folder is a child of the run's)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    path = base / name
    path.mkdir(exist_ok=True)
    return path


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold the lock of `folder` (a file in it) against every other process."""
    with (folder / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
