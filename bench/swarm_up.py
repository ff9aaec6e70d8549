"""How long `kfactory up` takes to have every actor live, a SIGKILLed actor to be back,
and `kfactory down` to leave nothing running.

Usage: PYTHONPATH=$PWD .venv/bin/python bench/swarm_up.py [--config ops/deploy/swarm.toml]

Runs `kfactory up --config C --detach` in a fresh run folder (the embedded hub), then
listens to the heartbeats as the cli user: "live" is the first beat of every actor
process the swarm's state names. Then it SIGKILLs one verifier and times, from the kill,
the replacement's start (the state file) and its first heartbeat; then `kfactory down`,
to the moment no process of the swarm is left. Times include each interpreter's start,
which dominates on a loaded host.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bus.connection import connect
from bus.heartbeat import Heartbeat, watch
from ops.accounts import client_auth
from ops.supervisor import SwarmState, read_state, running


def _kfactory(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _actor_pids(state: SwarmState) -> set[int]:
    return {p.pid for p in state.processes if p.name != "hub" and p.pid is not None}


async def _measure(home: Path, config: Path) -> dict[str, float]:
    figures: dict[str, float] = {}
    started = time.monotonic()
    up = _kfactory(home, "up", "--config", str(config), "--detach")
    if up.returncode != 0:
        raise SystemExit(f"up failed: {up.stderr}")
    figures["up_returned_s"] = time.monotonic() - started
    state = read_state(home)
    assert state is not None and state.url is not None
    heard: dict[int, float] = {}
    beat_arrived = asyncio.Event()

    async def seen(beat: Heartbeat, _at: float) -> None:
        heard.setdefault(beat.pid, time.monotonic())
        beat_arrived.set()

    async def next_beat() -> None:
        await beat_arrived.wait()
        beat_arrived.clear()

    nc = await connect(state.url, "bench-swarm", auth=client_auth(home, "cli"))
    stop = await watch(nc, seen)
    try:
        while not _actor_pids(state) <= set(heard):
            await next_beat()
        figures["all_live_s"] = max(heard[pid] for pid in _actor_pids(state)) - started
        victim = next(p for p in state.processes if p.name.startswith("verifier"))
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        replacement = await asyncio.to_thread(_replacement, home, victim.name, victim.pid)
        figures["restart_started_s"] = time.monotonic() - killed
        while replacement not in heard:
            await next_beat()
        figures["restart_live_s"] = heard[replacement] - killed
    finally:
        await stop()
        await nc.close()
    everyone = {state.pid, replacement, *(p.pid for p in state.processes if p.pid)}
    figures.update(await asyncio.to_thread(_down, home, everyone))
    return figures


def _replacement(home: Path, name: str, killed: int) -> int:
    """The pid the supervisor started in `name`'s place."""
    while True:
        state = read_state(home)
        slot = next(p for p in state.processes if p.name == name) if state else None
        if slot is not None and slot.pid not in (None, killed):
            return slot.pid
        time.sleep(0.01)


def _down(home: Path, everyone: set[int]) -> dict[str, float]:
    started = time.monotonic()
    down = _kfactory(home, "down")
    command = time.monotonic() - started
    while any(running(pid) for pid in everyone):
        time.sleep(0.01)
    print(down.stderr.strip())
    log = (home / "swarm" / "up.log").read_text()
    print("\n".join(line for line in log.splitlines() if "warning" in line or "stopped" in line))
    return {"down_command_s": command, "down_nothing_left_s": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("ops/deploy/swarm.toml"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        figures = asyncio.run(_measure(Path(folder) / "home", args.config.absolute()))
    for name, value in figures.items():
        print(f"{name:22} {value:6.2f}")


if __name__ == "__main__":
    main()
