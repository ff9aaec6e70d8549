"""Helpers for the fault tests (tests/test_faults*.py), which break a running swarm on
purpose with real nats-server, `kfactory server` and `kfactory actor` processes:

- `ActorProcess`: `kfactory actor ROLE` as a child a test can SIGKILL, logging to a file;
- `watching_beats`: every heartbeat as the cli user hears it, so a test can kill a worker
  while its beat says it is working on a job (`Beats.until`);
- `crew_without`: every cpu role in the test's process but those it runs as processes;
- `outcomes`: each candidate's events emitted by one role;
- `WorkerHost`: a second host, a network namespace behind a veth pair whose link a test
  cuts (`partition`) and restores (`heal`). It needs root and iproute2; without them
  `unavailable` says why, and the test skips saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec

from actors.roles.registry import ROLES
from bus.connection import Msg, connect
from bus.heartbeat import HEARTBEAT_PREFIX, Heartbeat
from eventstore.events import Event
from ops.accounts import seed_path
from ops.hub import Hub
from tests.test_stalls import Crew

ROOT = Path(__file__).resolve().parent.parent
CPU_ROLES = [name for name, role in ROLES.items() if role.targets is None or "cpu" in role.targets]


class ActorProcess:
    """`kfactory actor ROLE` as a child process, logging to `log`."""

    def __init__(
        self,
        role: str,
        url: str,
        creds: Path,
        instance: str,
        log: Path,
        prefix: Iterable[str] = (),
    ) -> None:
        self.role, self.instance, self.log = role, instance, log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [*prefix, sys.executable, "-m", "ops.cli", "actor", role, "--nats", url,
                 "--creds", str(creds), "--instance", instance, "--home", str(log.parent)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip

    @classmethod
    def of_hub(cls, hub: Hub, role: str, instance: str, logs: Path) -> ActorProcess:
        """A process joining `hub` with the role's credentials from the hub's run folder."""
        return cls(role, hub.url, seed_path(hub.home, role), instance, logs / f"{instance}.log")

    def check(self) -> None:
        """Raise, with its log, if the process has exited."""
        if self.process.poll() is not None:
            raise AssertionError(
                f"{self.instance} exited with {self.process.returncode}: "
                + self.log.read_text(errors="replace")[-2000:]
            )

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


class Beats:
    """Every heartbeat seen on the bus since the watch began."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, Heartbeat]] = []
        self._arrived = asyncio.Event()

    def add(self, beat: Heartbeat) -> None:
        self.seen.append((time.monotonic(), beat))
        self._arrived.set()

    async def until(
        self,
        wanted: Callable[[Heartbeat], bool],
        timeout: float,
        alive: ActorProcess | None = None,
    ) -> Heartbeat:
        """The first beat (already seen or still to come) for which `wanted` holds; fails
        at once if the process `alive` exits first."""
        deadline = time.monotonic() + timeout
        checked = 0
        while True:
            if alive is not None:
                alive.check()
            for _, beat in self.seen[checked:]:
                if wanted(beat):
                    return beat
            checked = len(self.seen)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no such heartbeat in {timeout:.0f} s")
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), min(left, 1.0))


@asynccontextmanager
async def watching_beats(hub: Hub) -> AsyncIterator[Beats]:
    """Heartbeats as the cli user sees them (`kfactory ps`)."""
    beats = Beats()
    decode = msgspec.json.Decoder(Heartbeat).decode

    async def on_beat(msg: Msg) -> None:
        beats.add(decode(msg.data))

    nc = await connect(hub.url, "kf-test-beats", auth=hub.auth("cli"))
    try:
        await nc.subscribe(f"{HEARTBEAT_PREFIX}.*.*", cb=on_beat)
        yield beats
    finally:
        await nc.close()


@asynccontextmanager
async def crew_without(hub: Hub, *absent: str) -> AsyncIterator[Crew]:
    """Every cpu role in this process but those `absent` (a test runs them as processes)."""
    team = Crew(hub.url, hub.auth)
    try:
        for name in CPU_ROLES:
            if name not in absent:
                await team.start(name, ROLES[name].create("cpu"))
        yield team
    finally:
        await team.stop_all()


def outcomes(events: list[Event], role: str) -> dict[str, list[Event]]:
    """Each candidate's events emitted by `role` (its outcomes), by candidate id."""
    found: dict[str, list[Event]] = {}
    for event in events:
        candidate = getattr(event, "candidate_id", None)
        if event.actor.role == role and candidate is not None:
            found.setdefault(candidate, []).append(event)
    return found


class WorkerHost:
    """A network namespace joined to this one by a veth pair: a second host whose link
    can be cut (`partition`) and restored (`heal`). The hub side is `hub_address`."""

    def __init__(self, tag: int) -> None:
        self.name = f"kf-worker-{tag}"
        self.outer, self.inner = f"kfh{tag}", f"kfw{tag}"
        subnet = f"10.{200 + tag % 50}.{tag % 250}"
        self.hub_address, self.address = f"{subnet}.1", f"{subnet}.2"

    @staticmethod
    def unavailable() -> str | None:
        """Why this machine cannot make one (None: it can)."""
        if shutil.which("ip") is None:
            return "iproute2 (`ip`) is not installed"
        if os.geteuid() != 0:
            return "network namespaces need root"
        probe = subprocess.run(
            ["ip", "netns", "add", "kf-probe"], capture_output=True, text=True, check=False
        )
        if probe.returncode != 0:
            return f"`ip netns add` is not allowed here: {probe.stderr.strip()}"
        subprocess.run(["ip", "netns", "del", "kf-probe"], check=False)
        return None

    def _ip(self, *args: str, inside: bool = False) -> None:
        prefix = ["ip", "netns", "exec", self.name] if inside else []
        subprocess.run([*prefix, "ip", *args], check=True, capture_output=True)

    def create(self) -> None:
        self._ip("netns", "add", self.name)
        self._ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        self._ip("link", "set", self.inner, "netns", self.name)
        self._ip("addr", "add", f"{self.hub_address}/24", "dev", self.outer)
        self._ip("link", "set", self.outer, "up")
        self._ip("addr", "add", f"{self.address}/24", "dev", self.inner, inside=True)
        self._ip("link", "set", self.inner, "up", inside=True)
        self._ip("link", "set", "lo", "up", inside=True)

    def destroy(self) -> None:
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)

    @property
    def prefix(self) -> list[str]:
        """What runs a command on this host."""
        return ["ip", "netns", "exec", self.name]

    def partition(self) -> None:
        """Cut the link: packets are dropped, no connection is closed."""
        self._ip("link", "set", self.outer, "down")

    def heal(self) -> None:
        self._ip("link", "set", self.outer, "up")
