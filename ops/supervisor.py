"""Supervising the processes of `kfactory up`: start them, start again whatever exits
(with backoff), stop them all on request.

The supervisor is a plain loop, no event loop: every 50 ms it reaps what exited and
starts what is due. A process that exits is started again after `FIRST_DELAY` s, doubling
up to `MAX_DELAY` while it keeps exiting; one that ran `STABLE_AFTER` s starts over at
`FIRST_DELAY`. Children die with the supervisor (PR_SET_PDEATHSIG), so killing it
orphans nothing. Its state (pids, restarts) is in `HOME/swarm/state.json`, which is how
`kfactory down` finds it.

The hub (a `kfactory server` child, when no URL is given) starts first; the actors once
`server.json` names the URL of that child. Every exit is logged with its status and the
delay before the next start. The state says `ready` once every process has started (what
`up --detach` waits for). `stop` sends SIGTERM to the actors, then to the hub (which
records their last events), and SIGKILLs what has not stopped `STOP_WAIT` s after its
SIGTERM. `stop_swarm` (`kfactory down`) sends SIGTERM to the supervisor, then kills
whatever of the state's processes is still there, but only a pid whose command line
names the run folder (a recycled pid is left alone).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import structlog

from bus.server import die_with_parent, pid_alive
from gpu_workers.atomic_file import write_atomically
from ops.home import running_server

log = structlog.get_logger("ops.supervisor")

FIRST_DELAY = 0.5
MAX_DELAY = 30.0
STABLE_AFTER = 30.0
#: After SIGTERM, how long a group of children has before SIGKILL: each stops within 2 s
#: of the signal (ops/lifecycle.py), plus the interpreter's exit on a loaded host.
STOP_WAIT = 5.0
TICK = 0.05


def swarm_dir(home: Path) -> Path:
    return home / "swarm"


def state_file(home: Path) -> Path:
    return swarm_dir(home) / "state.json"


class ProcessState(msgspec.Struct, frozen=True):
    name: str
    pid: int | None
    restarts: int
    argv: list[str]


class SwarmState(msgspec.Struct, frozen=True):
    pid: int
    """The supervisor's."""
    config: str
    url: str | None
    ready: bool
    """Every process has been started at least once."""
    processes: list[ProcessState]


def read_state(home: Path) -> SwarmState | None:
    try:
        return msgspec.json.decode(state_file(home).read_bytes(), type=SwarmState)
    except (OSError, msgspec.DecodeError):
        return None


def kfactory_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "ops.cli", *args]


@dataclass
class Child:
    name: str
    argv: Callable[[str | None], list[str]]
    """The command line, given the hub's URL (known once the hub is up)."""
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    delay: float = FIRST_DELAY
    due: float = 0.0
    started_at: float = 0.0
    last_argv: list[str] = field(default_factory=list)

    def start(self, url: str | None) -> None:
        self.last_argv = self.argv(url)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                self.last_argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        self.started_at = time.monotonic()
        log.info("started", process=self.name, pid=self.process.pid)

    def reap(self, now: float) -> bool:
        """Whether it just exited; if so, when it starts again is set (backoff)."""
        if self.process is None or self.process.poll() is None:
            return False
        code = self.process.returncode
        if now - self.started_at >= STABLE_AFTER:
            self.delay = FIRST_DELAY
        self.due = now + self.delay
        self.restarts += 1
        log.warning(
            "exited; starting it again",
            process=self.name,
            pid=self.process.pid,
            status=f"signal {-code}" if code < 0 else code,
            restart=self.restarts,
            in_s=self.delay,
        )
        self.delay = min(self.delay * 2, MAX_DELAY)
        self.process = None
        return True


class Supervisor:
    def __init__(
        self, home: Path, config: Path, hub: Child | None, actors: list[Child], url: str | None
    ) -> None:
        self.home = home
        self.config = config
        self.hub = hub
        self.actors = actors
        self.url = url
        self.ready = False

    @property
    def children(self) -> list[Child]:
        return ([self.hub] if self.hub else []) + self.actors

    def run(self, stopping: Callable[[], bool]) -> None:
        """Supervise until `stopping()` says so, then stop everything."""
        try:
            while not stopping():
                if self._tick(time.monotonic()):
                    self._write_state()
                time.sleep(TICK)
        finally:
            self.stop()

    def _tick(self, now: float) -> bool:
        changed = False
        if self.url is None and self.hub is not None and self.hub.process is not None:
            info = running_server(self.home)
            if info is not None and info.pid == self.hub.process.pid:
                self.url = info.url
                changed = True
        for child in self.children:
            changed |= child.reap(now)
            waits_for_hub = child is not self.hub and self.url is None
            if child.process is None and child.due <= now and not waits_for_hub:
                child.start(self.url)
                changed = True
        if not self.ready and all(c.process is not None for c in self.children):
            self.ready = changed = True
        return changed

    def _write_state(self) -> None:
        state = SwarmState(
            pid=os.getpid(),
            config=str(self.config),
            url=self.url,
            ready=self.ready,
            processes=[
                ProcessState(c.name, c.process.pid if c.process else None, c.restarts, c.last_argv)
                for c in self.children
            ],
        )
        write_atomically(state_file(self.home), msgspec.json.encode(state))

    def stop(self) -> None:
        """The actors first (the hub records their last events), then the hub."""
        _terminate([c for c in self.actors if c.process is not None])
        if self.hub is not None and self.hub.process is not None:
            _terminate([self.hub])
        state_file(self.home).unlink(missing_ok=True)
        log.info("stopped", processes=len(self.children))


def _terminate(children: list[Child]) -> None:
    for child in children:
        assert child.process is not None
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT
    for child in children:
        assert child.process is not None
        try:
            child.process.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            log.warning("did not stop; killing it", process=child.name, pid=child.process.pid)
            child.process.kill()
            child.process.wait()
        child.process = None


def stop_swarm(home: Path, timeout: float = 2 * STOP_WAIT + 5.0) -> list[str]:
    """Stop the swarm of `home` (SIGTERM to its supervisor, which stops the rest), and
    whatever it left behind. Returns what was still running and had to be killed."""
    state = read_state(home)
    if state is None:
        return []
    if running(state.pid):
        os.kill(state.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while running(state.pid) and time.monotonic() < deadline:
            time.sleep(TICK)
    killed = []
    for process in state.processes:
        if process.pid is not None and _is_ours(process.pid, home):
            os.kill(process.pid, signal.SIGKILL)
            killed.append(f"{process.name} (pid {process.pid})")
    if _is_ours(state.pid, home):
        os.kill(state.pid, signal.SIGKILL)
        killed.append(f"the supervisor (pid {state.pid})")
    state_file(home).unlink(missing_ok=True)
    return killed


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for its parent to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return pid_alive(pid) and not Path("/proc/self").exists()  # no /proc: trust kill(0)
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _is_ours(pid: int, home: Path) -> bool:
    """A live process of this swarm (not a recycled pid): its command line names `home`."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return os.fsencode(str(home)) in argv
