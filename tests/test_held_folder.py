"""Held folders: a killed maker's folder is removed by the next one made, and nothing else is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpu_workers.held_folder import HeldFolder, held_folder, reclaim
from gpu_workers.recheck_pool import RecheckPool

PREFIX = "kf-held-test-"


@pytest.fixture(autouse=True)
def private_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own temp folder, here and in the processes it starts."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@contextmanager
def maker(make: str) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A process that runs `make` (which sets `path`), prints the path and waits."""
    code = f"import sys, time\n{make}\nprint(path, flush=True)\ntime.sleep(120)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        yield child, Path(child.stdout.readline().strip())
    finally:
        child.kill()
        child.wait()


MAKERS = {  # the prefix, and the code that makes a folder with it in a worker
    "held folder": (
        PREFIX,
        f"from gpu_workers.held_folder import HeldFolder\nheld = HeldFolder({PREFIX!r})\n"
        "path = held.path",
    ),
    "re-check pool": (
        "kf-recheck-pool-",
        "from gpu_workers.recheck_pool import RecheckPool\npool = RecheckPool()\n"
        "path = pool.folder",
    ),
}


@pytest.mark.parametrize(("prefix", "make"), MAKERS.values(), ids=MAKERS.keys())
def test_a_killed_makers_folder_is_removed_by_the_next_one_made(prefix: str, make: str) -> None:
    with maker(make) as (child, path):
        (path / "inputs.npy").write_bytes(b"x" * 4096)
        while_alive = HeldFolder(prefix)
        assert (path / "inputs.npy").is_file(), "a live maker's folder was removed"
        child.send_signal(signal.SIGKILL)
        child.wait()
        after_death = HeldFolder(prefix)
        assert not path.exists()
        assert while_alive.path.is_dir() and after_death.path.is_dir()
    while_alive.release()
    after_death.release()
    assert not while_alive.path.exists() and not after_death.path.exists()


def test_a_pool_is_removed_when_its_worker_lets_go_of_it() -> None:
    pool = RecheckPool()
    folder = pool.folder
    assert folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700
    pool.close()
    pool.close()
    assert not folder.exists()


def test_what_this_module_did_not_make_is_left_alone(private_temp: Path) -> None:
    foreign = private_temp / f"{PREFIX}foreign"  # no lock file: an older version's, or anyone's
    foreign.mkdir()
    target = private_temp / "elsewhere"
    target.mkdir()
    (target / ".held").touch()
    (private_temp / f"{PREFIX}link").symlink_to(target)
    (private_temp / f"{PREFIX}file").write_text("not a folder")

    assert reclaim(PREFIX) == []

    assert foreign.is_dir() and (private_temp / f"{PREFIX}link").is_symlink()
    assert (target / ".held").is_file() and (private_temp / f"{PREFIX}file").is_file()


def test_a_folder_is_held_from_the_moment_it_has_its_name(private_temp: Path) -> None:
    with held_folder(PREFIX) as path:
        assert path.parent == private_temp and path.name.startswith(PREFIX)
        assert reclaim(PREFIX) == []
        assert path.is_dir()
        assert not [p for p in private_temp.iterdir() if p.name.startswith(".")]
    assert not path.exists()


def test_a_reclaimed_folder_is_reported(private_temp: Path) -> None:
    with maker(MAKERS["held folder"][1]) as (child, path):
        child.kill()
        child.wait()
        assert reclaim(PREFIX) == [path]
        assert not path.exists()
    assert os.listdir(private_temp) == []
