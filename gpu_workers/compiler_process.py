"""Run a compiler on untrusted source: memory and CPU capped, a wall-clock timeout that
ends the compiler's own children too (cc1, cicc, ptxas), a minimal environment."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path


def run_compiler(
    argv: list[str],
    cwd: Path,
    *,
    timeout_s: float,
    address_space_bytes: int,
    extra_env: dict[str, str] | None = None,
) -> tuple[int | None, str]:
    """(exit status, stdout and stderr together); status None when it timed out."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "TMPDIR": str(cwd),
        "HOME": str(cwd),
        "LANG": "C",
        **(extra_env or {}),
    }
    tool = Path(argv[0]).name
    prlimit = shutil.which("prlimit")
    if prlimit is not None:
        argv = [
            prlimit,
            f"--as={address_space_bytes}",
            f"--cpu={max(1, int(timeout_s))}",
            "--",
            *argv,
        ]
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        stdin=subprocess.DEVNULL,  # `#include "/dev/stdin"` reads nothing of the worker's
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",  # a source can make the compiler echo any bytes
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # the group may be gone already
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, f"{tool} timed out after {timeout_s:.0f} s"
    return proc.returncode, out
