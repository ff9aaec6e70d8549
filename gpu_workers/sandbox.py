"""Run untrusted code in a child process that cannot take the worker down with it.

The child is `python -m gpu_workers.sandbox MODULE [ARGS...]`. Before it imports MODULE
(which loads the untrusted code) it limits itself: RLIMIT_CPU, RLIMIT_AS, no core files,
a capped file size, death with its parent, and a fresh network namespace where the host
permits one. The parent adds a wall-clock timeout and kills the child's whole process
group. The child runs in its own temp dir with a scrubbed environment. What isolation was
actually obtained is written to `sandbox.json` and reported, never assumed.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from gpu_workers.results import SandboxReport

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
CAPTURE_LIMIT = 16 * 1024
STATUS_FILE = "sandbox.json"
ORPHANED_EXIT = 125
"""The child's exit status when its worker died before the child could arm
PR_SET_PDEATHSIG: nothing is left to report to, and nothing may run on unwatched."""
PASSED_THROUGH_ENV = ("OPENBLAS_CORETYPE", "LANG")


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    cpu_seconds: int = 120
    address_space_bytes: int = 8 << 30
    wall_seconds: float = 60.0
    file_size_bytes: int = 4 << 30


class IsolationStatus(msgspec.Struct, frozen=True, kw_only=True):
    network_isolated: bool
    network_note: str


class SandboxOutcome(msgspec.Struct, frozen=True, kw_only=True):
    returncode: int | None
    """Exit status; negative for a signal (as subprocess reports it)."""
    signal_name: str | None
    timed_out: bool
    cpu_limit_hit: bool
    wall_seconds: float
    cpu_seconds: float
    other_cpu_seconds: float | None
    """CPU time the rest of the host used while the child ran (None where /proc/stat is
    unreadable): other work on the host skews any timing the child did."""
    stdout: str
    stderr: str
    report: SandboxReport

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _project_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def scrubbed_env(workdir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "PYTHONPATH": _project_root(),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
    }
    env.update({k: os.environ[k] for k in PASSED_THROUGH_ENV if k in os.environ})
    env.update(extra or {})
    return env


def run_sandboxed(
    module: str,
    args: list[str],
    *,
    workdir: Path,
    limits: Limits,
    env: dict[str, str] | None = None,
    watch: Callable[[], None] | None = None,
) -> SandboxOutcome:
    """Run `module.main(args)` in a limited child inside `workdir`; never raises for its
    faults. `watch`, if given, is called every few milliseconds while the child runs; if it
    raises, the child is killed and the error raised here."""
    command = [
        sys.executable,
        "-m",
        "gpu_workers.sandbox",
        str(os.getpid()),
        msgspec.json.encode(limits).decode(),
        module,
        *args,
    ]
    stdout_path, stderr_path = workdir / "stdout.txt", workdir / "stderr.txt"
    busy_before = host_busy_seconds()
    started = time.monotonic()
    deadline = started + limits.wall_seconds
    timed_out = False
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            command,
            cwd=workdir,
            env=scrubbed_env(workdir, env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            close_fds=True,
        )
        status_word, usage = 0, None
        while True:
            pid, status_word, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if watch is not None:
                try:
                    watch()
                except BaseException:  # the caller gave up on the run: nothing may outlive it
                    os.killpg(proc.pid, signal.SIGKILL)
                    os.wait4(proc.pid, 0)
                    raise
            if time.monotonic() > deadline:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                _, status_word, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.005)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # any grandchildren it left behind
        proc.returncode = os.waitstatus_to_exitcode(status_word)
    wall = time.monotonic() - started
    busy_after = host_busy_seconds()
    code = proc.returncode
    sig = signal.Signals(-code).name if code < 0 else None
    cpu_used = usage.ru_utime + usage.ru_stime if usage is not None else 0.0
    status = _read_status(workdir)
    return SandboxOutcome(
        returncode=code,
        signal_name=sig,
        timed_out=timed_out,
        cpu_limit_hit=sig == "SIGXCPU" or (not timed_out and cpu_used >= limits.cpu_seconds),
        cpu_seconds=cpu_used,
        other_cpu_seconds=(
            max(0.0, busy_after - busy_before - cpu_used)
            if busy_before is not None and busy_after is not None
            else None
        ),
        wall_seconds=wall,
        stdout=_tail(stdout_path),
        stderr=_tail(stderr_path),
        report=SandboxReport(
            network_isolated=status.network_isolated,
            network_note=status.network_note,
            cpu_seconds_limit=limits.cpu_seconds,
            address_space_limit_bytes=limits.address_space_bytes,
            wall_seconds_limit=limits.wall_seconds,
        ),
    )


def host_busy_seconds() -> float | None:
    """Non-idle CPU seconds of the whole host since boot, from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(v) for v in fields[:8]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    if len(data) > CAPTURE_LIMIT:
        data = b"...(truncated)...\n" + data[-CAPTURE_LIMIT:]
    return data.decode("utf-8", errors="replace")


def _read_status(workdir: Path) -> IsolationStatus:
    try:
        return msgspec.json.decode((workdir / STATUS_FILE).read_bytes(), type=IsolationStatus)
    except (OSError, msgspec.DecodeError):
        return IsolationStatus(
            network_isolated=False,
            network_note="the child died before reporting its isolation",
        )


# Child side ------------------------------------------------------------------------


def _confine(limits: Limits, worker_pid: int) -> IsolationStatus:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != worker_pid:
        # The worker died while this interpreter started, before the death signal was
        # armed: no one would ever stop this child (a driver waiting for a timed window
        # would wait for ever, holding its kernel host).
        os._exit(ORPHANED_EXIT)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 2))
    resource.setrlimit(resource.RLIMIT_AS, (limits.address_space_bytes, limits.address_space_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_bytes, limits.file_size_bytes))
    if libc.unshare(CLONE_NEWNET) == 0:
        return IsolationStatus(
            network_isolated=True, network_note="own network namespace (unshare CLONE_NEWNET)"
        )
    errno = ctypes.get_errno()
    return IsolationStatus(
        network_isolated=False,
        network_note=f"unshare(CLONE_NEWNET) refused by the host: {os.strerror(errno)}",
    )


def _child_main(argv: list[str]) -> None:
    worker_pid, limits_json, module_name, *args = argv
    limits = msgspec.json.decode(limits_json.encode(), type=Limits)
    status = _confine(limits, int(worker_pid))
    Path(STATUS_FILE).write_bytes(msgspec.json.encode(status))
    module = importlib.import_module(module_name)
    module.main(args)


if __name__ == "__main__":
    _child_main(sys.argv[1:])
