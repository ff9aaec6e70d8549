"""How long the factory goes without a recorder when the owning `kfactory server` dies.

On a local 3-node JetStream cluster (bus/cluster.py), an owner and a standby `kfactory
server --nats URL1,URL2,URL3` record; the owner is killed with SIGKILL at a random point
of its renewal cycle, and the standby's takeover is timed: until it holds the lease
(from its log) and until its store answers queries. Each run checks that the standby's
store then holds every event of the stream exactly once.

python bench/recorder_takeover.py [--runs 5] [--ttl 5]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bus.cluster import LocalCluster, wait_for_jetstream
from bus.connection import Client, connect, jetstream
from bus.streams import ensure_events_stream
from eventstore.emitter import Emitter
from eventstore.events import ActorRef, HostCalibrated, new_event
from eventstore.queries import StoreStatus, StoreUnavailable, status

ACTOR = ActorRef(role="benchmarker", instance="bench-1", host="localhost")


def _server(home: Path, url: str, ttl: int) -> subprocess.Popen[bytes]:
    command = ["server", "--home", str(home), "--nats", url, "--lease-ttl", str(ttl)]
    with home.with_suffix(".log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", *command], stdout=subprocess.DEVNULL, stderr=log
        )


async def _status(nc: Client) -> StoreStatus | None:
    try:
        return await status(nc, timeout=0.5)
    except StoreUnavailable:
        return None


async def _until(nc: Client, home: Path, timeout: float = 120) -> StoreStatus:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await _status(nc)
        if found is not None and found.path == str(home / "events.duckdb"):
            return found
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{home} never answered")


def _logged_at(home: Path, text: str) -> float:
    """The wall-clock time of the first log line of `home`'s server holding `text`."""
    for line in home.with_suffix(".log").read_text().splitlines():
        if text in line:
            stamp = line.split(" ", 1)[0].rstrip("Z")
            return datetime.datetime.fromisoformat(stamp).replace(tzinfo=datetime.UTC).timestamp()
    raise AssertionError(f"{home}: no log line with {text!r}")


async def _wait_logged(home: Path, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while text not in home.with_suffix(".log").read_text():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{home}: {text!r} never logged")
        await asyncio.sleep(0.05)


async def _events(nc: Client, count: int) -> None:
    await Emitter(jetstream(nc)).emit_many(
        [
            new_event(
                HostCalibrated,
                campaign_id="takeover",
                actor=ACTOR,
                device="cpu",
                bandwidth_gbs=1.0,
                peak_gflops=1.0,
            )
            for _ in range(count)
        ]
    )


async def run(runs: int, ttl: int) -> list[tuple[float, float]]:
    folder = Path(tempfile.mkdtemp(prefix="kf-takeover-"))
    times: list[tuple[float, float]] = []
    with LocalCluster(folder / "cluster", size=3) as cluster:
        await wait_for_jetstream(cluster.url)
        nc = await connect(cluster.url, "bench")
        try:
            js = jetstream(nc)
            await ensure_events_stream(js)
            for index in range(runs):
                owner_home, standby_home = folder / f"a{index}", folder / f"b{index}"
                owner = _server(owner_home, cluster.url, ttl)
                await _until(nc, owner_home)
                standby = _server(standby_home, cluster.url, ttl)
                await _wait_logged(standby_home, "standby")
                await _events(nc, 100)
                await asyncio.sleep(random.uniform(0, ttl))  # anywhere in the renewal cycle
                killed_wall, killed = time.time(), time.monotonic()
                owner.send_signal(signal.SIGKILL)
                owner.wait()
                await _events(nc, 100)
                answered = await _until(nc, standby_home)
                serving = time.monotonic() - killed
                lease = _logged_at(standby_home, "recording lease taken") - killed_wall
                total = (await js.stream_info("KF_EVENTS")).state.messages
                while answered.last_position < total:
                    await asyncio.sleep(0.05)
                    answered = await _until(nc, standby_home)
                assert answered.last_position == total, (answered, total)
                standby.send_signal(signal.SIGTERM)
                standby.wait(60)
                times.append((lease, serving))
                print(
                    f"run {index + 1}: lease taken {lease:.2f} s, store answering {serving:.2f} s "
                    f"after the kill; {total} events, each once",
                    flush=True,
                )
        finally:
            await nc.close()
    return times


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ttl", type=int, default=5)
    args = parser.parse_args()
    results = asyncio.run(run(args.runs, args.ttl))
    leases = [lease for lease, _ in results]
    serving = [serve for _, serve in results]
    print(
        f"ttl {args.ttl} s, {args.runs} runs: lease taken after a median "
        f"{statistics.median(leases):.2f} s (max {max(leases):.2f}); store answering after "
        f"a median {statistics.median(serving):.2f} s (max {max(serving):.2f})"
    )
