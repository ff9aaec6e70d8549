"""Temporary folders held by the process that made them, and reclaimed once it is gone.

A worker that is killed (SIGKILL from the OOM killer, a supervisor or `kill -9`) runs no
finalizer, so whatever it kept in the temp folder would stay there for good: a re-check
pool is about 1 GiB at softmax 4096x4096. A held folder keeps an exclusive `flock` on a
file inside it for as long as its maker holds it open. The OS drops that lock when the
maker dies, however it dies, and every folder later made with the same prefix first
removes the ones whose lock it can take.

A folder is given its name only once its lock is held (it is made under a hidden name and
renamed), so a reclaimer never sees a live folder unlocked. Folders of another user, and
ones without the lock file (made by older versions, or not by this module), are left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".held"


class HeldFolder:
    """A fresh private (mode 0700) folder in the temp folder, named `prefix` + random; removed
    by `release` or once this object is collected, or by a later `HeldFolder` of the same
    prefix if this process is killed first."""

    def __init__(self, prefix: str) -> None:
        reclaim(prefix)
        staging = Path(tempfile.mkdtemp(prefix=f".{prefix}"))
        lock = os.open(staging / LOCK_FILE, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        self.path = staging.with_name(staging.name.removeprefix("."))
        os.rename(staging, self.path)
        self._release = weakref.finalize(self, _remove, self.path, lock)

    def release(self) -> None:
        """Remove the folder and let go of it (again: nothing)."""
        self._release()


def _remove(path: Path, lock: int) -> None:
    shutil.rmtree(path, ignore_errors=True)
    os.close(lock)


@contextlib.contextmanager
def held_folder(prefix: str) -> Iterator[Path]:
    """A `HeldFolder` for the length of a `with` block."""
    folder = HeldFolder(prefix)
    try:
        yield folder.path
    finally:
        folder.release()


def reclaim(prefix: str) -> list[Path]:
    """Remove this user's folders named `prefix`* in the temp folder whose maker is gone;
    returns them."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        if _abandoned(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _abandoned(folder: Path) -> bool:
    try:
        status = folder.lstat()  # a link is not followed
        if status.st_uid != os.getuid() or not stat.S_ISDIR(status.st_mode):
            return False
        lock = os.open(folder / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:  # gone meanwhile, not a held folder, or not ours to open
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its maker is alive
        return False
    finally:
        os.close(lock)
    return True
