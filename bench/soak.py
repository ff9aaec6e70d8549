"""The orchestration under load and faults: `bench/soak.py --minutes M`.

On a 3-node JetStream cluster (bus/cluster.py) this runs two `kfactory server --nats`
(the recorder and its standby, each started again when it exits, as systemd would), one
`kfactory actor` process per role (two verifiers, two benchmarkers) and back-to-back
campaigns of the tiny vector-add problem (tests/vadd_problem.py), so the bus and the
store, not the kernels, do the work. Every 30 s it SIGKILLs a random actor and starts
another in its place (what a supervisor does); every 2 minutes it SIGKILLs a random NATS
node and starts it again 5 s later.

It prints a table and writes bench/results/soak.json:
- candidates settled per second;
- orchestration overhead per candidate, p50 and p99: for each hop (proposed -> written ->
  verified -> timed) the time from the moment the work was there *and* the instance that
  took it was free, to the moment it started (heartbeats carry each job's start and end),
  summed over the hops. Compile, verification and timing (the handlers' time) are left
  out, and so is waiting for a busy worker or the device: that is capacity, not overhead;
- events lost: ids seen published on the bus (core NATS) that the store does not hold;
- duplicate evaluations: a candidate verified or timed more than once in the store;
- recoveries, and the time each took: an actor, from its kill to its replacement's first
  heartbeat; a node, from its kill to KF_EVENTS having a leader and every replica current.

Usage:
  .venv/bin/python bench/soak.py --minutes 10
  .venv/bin/python bench/soak.py --minutes 1 --out /tmp/soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bus.cluster import LocalCluster, wait_for_jetstream  # noqa: E402
from bus.connection import Client, Msg, connect, jetstream  # noqa: E402
from bus.heartbeat import HEARTBEAT_PREFIX, Heartbeat  # noqa: E402
from bus.subjects import STREAM  # noqa: E402
from eventstore.codec import decode  # noqa: E402
from eventstore.duckdb_store import DuckDBEventStore  # noqa: E402
from tests.vadd_problem import vadd_campaign  # noqa: E402

RESULTS = ROOT / "bench" / "results"
#: Processes per role; the worker roles have two, so a killed one's work has a taker.
CREW = {"planner": 1, "kernel-writer": 1, "fuser": 1, "librarian": 1, "verifier": 2,
        "benchmarker": 2}  # fmt: skip
ACTOR_KILL_EVERY = 30.0
NODE_KILL_EVERY = 120.0
NODE_DOWN_FOR = 5.0
#: The handler that starts each hop of a candidate's path, by the event it reacts to.
HOPS = ("CandidateProposed", "KernelWritten", "KernelVerified")
SETTLING = ("BenchmarkCompleted", "KernelRejected", "CandidateDeduplicated", "DeadLettered")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _kfactory(args: list[str], log: Path, stdout: int | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ops.cli", *args],
            stdin=subprocess.DEVNULL,
            stdout=stdout if stdout is not None else out,
            stderr=out,
            cwd=ROOT,
            env=_env(),
        )


@dataclass
class Recovery:
    what: str
    killed_at: float
    seconds: float | None = None
    #: A node: seconds until KF_EVENTS had a leader on another node (0: it had one).
    stream_led_after: float | None = None


@dataclass
class Watch:
    """What the soak sees on the bus: published event ids and every heartbeat."""

    published: set[str] = field(default_factory=set)
    beats: list[Heartbeat] = field(default_factory=list)

    async def on_event(self, msg: Msg) -> None:
        with contextlib.suppress(Exception):
            self.published.add(decode(msg.data).event_id)

    async def on_beat(self, msg: Msg) -> None:
        with contextlib.suppress(Exception):
            self.beats.append(msgspec.json.decode(msg.data, type=Heartbeat))


class Soak:
    def __init__(
        self,
        folder: Path,
        minutes: float,
        seed: int,
        actor_kill_every: float = ACTOR_KILL_EVERY,
        node_kill_every: float = NODE_KILL_EVERY,
    ) -> None:
        self.folder = folder
        self.minutes = minutes
        self.actor_kill_every = actor_kill_every
        self.node_kill_every = node_kill_every
        self.random = random.Random(seed)
        self.logs = folder / "logs"
        self.logs.mkdir(parents=True)
        self.cluster = LocalCluster(folder / "cluster", size=3)
        self.recorders = [Recorder(folder / name, self.logs) for name in ("hub-a", "hub-b")]
        self.actors: dict[str, subprocess.Popen[bytes]] = {}
        self.recoveries: list[Recovery] = []
        self.watch = Watch()
        self.campaigns: list[dict[str, Any]] = []
        self._started = 0

    def _start_actor(self, role: str) -> str:
        self._started += 1
        instance = f"{role}-{self._started}"
        self.actors[instance] = _kfactory(
            ["actor", role, "--nats", self.cluster.url, "--instance", instance,
             "--home", str(self.folder / "actor-home")],
            self.logs / f"{instance}.log",
        )  # fmt: skip
        return instance

    async def _first_beat(self, instance: str, since: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(b.instance == instance for b in self.watch.beats[since:]):
                return True
            await asyncio.sleep(0.05)
        return False

    async def kill_actors(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.actor_kill_every)
            if stop.is_set():
                return
            victim = self.random.choice(sorted(self.actors))
            role = victim.rsplit("-", 1)[0]
            recovery = Recovery(f"actor {victim}", time.time())
            self.recoveries.append(recovery)
            process = self.actors.pop(victim)
            process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(process.wait)
            since = len(self.watch.beats)
            replacement = self._start_actor(role)  # what a supervisor does
            if await self._first_beat(replacement, since, 120):
                recovery.seconds = time.time() - recovery.killed_at

    async def supervise_actors(self, stop: asyncio.Event) -> None:
        """Start again an actor that exits by itself (not one this soak killed)."""
        waiting: list[asyncio.Task[None]] = []
        while not stop.is_set():
            for instance, process in list(self.actors.items()):
                if process.poll() is None:
                    continue
                last = (self.logs / f"{instance}.log").read_text(errors="replace").strip()
                why = last.splitlines()[-1][:160] if last else f"exit {process.returncode}"
                recovery = Recovery(f"actor {instance} exited: {why}", time.time())
                self.recoveries.append(recovery)
                del self.actors[instance]
                since = len(self.watch.beats)
                replacement = self._start_actor(instance.rsplit("-", 1)[0])
                waiting.append(asyncio.create_task(self._back(recovery, replacement, since)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        await asyncio.gather(*waiting)

    async def _back(self, recovery: Recovery, instance: str, since: int) -> None:
        if await self._first_beat(instance, since, 120):
            recovery.seconds = time.time() - recovery.killed_at

    async def _recorder_owns(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(r.owns() for r in self.recorders):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no recorder took the lease in {timeout:.0f} s")
            await asyncio.sleep(0.2)

    async def _stream_whole(self, nc: Client) -> None:
        js = jetstream(nc, timeout=2.0)
        while True:
            with contextlib.suppress(Exception):
                info = await js.stream_info(STREAM)
                cluster = info.cluster
                if (
                    cluster is not None
                    and cluster.leader
                    and len(cluster.replicas or []) == 2
                    and all(r.current and not r.offline for r in cluster.replicas or [])
                ):
                    return
            await asyncio.sleep(0.2)

    async def _led_elsewhere(self, nc: Client, dead: str) -> None:
        js = jetstream(nc, timeout=1.0)
        while True:
            with contextlib.suppress(Exception):
                info = await js.stream_info(STREAM)
                if info.cluster is not None and info.cluster.leader not in (None, "", dead):
                    return
            await asyncio.sleep(0.05)

    async def kill_nodes(self, stop: asyncio.Event, nc: Client) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.node_kill_every)
            if stop.is_set():
                return
            victim = self.random.randrange(len(self.cluster.nodes))
            recovery = Recovery(f"nats node n{victim + 1}", time.time())
            self.recoveries.append(recovery)
            await asyncio.to_thread(self.cluster.kill, victim)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._led_elsewhere(nc, f"n{victim + 1}"), NODE_DOWN_FOR)
                recovery.stream_led_after = time.time() - recovery.killed_at
            await asyncio.sleep(max(0.0, recovery.killed_at + NODE_DOWN_FOR - time.time()))
            await asyncio.to_thread(self.cluster.restart, victim)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stream_whole(nc), 120)
                recovery.seconds = time.time() - recovery.killed_at

    async def supervise_recorders(self, stop: asyncio.Event) -> None:
        """Start again a recorder that exits (a deposed one does: what systemd's
        Restart=always does); recovered once some recorder owns the lease again."""
        pending: Recovery | None = None
        while not stop.is_set():
            for recorder in self.recorders:
                if recorder.process is not None and recorder.process.poll() is not None:
                    why = recorder.last_words()
                    if recorder.owns() and pending is None:
                        pending = Recovery(f"recorder {recorder.home.name}: {why}", time.time())
                        self.recoveries.append(pending)
                    recorder.start(self.cluster.url)
            if pending is not None and any(r.owns() for r in self.recorders):
                pending.seconds = time.time() - pending.killed_at
                pending = None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)

    async def run_campaigns(self, stop: asyncio.Event) -> None:
        problem = self.folder / "problem"
        number = 0
        while not stop.is_set():
            number += 1
            name = f"soak-{number}"
            campaign = vadd_campaign(problem, name, budget=8, per_generation=4, seed=number)
            run = _kfactory(
                ["run", str(campaign), "--nats", self.cluster.url, "--no-local-actors",
                 "--json", "--home", str(self.folder / "cli-home")],
                self.logs / f"{name}.log",
                stdout=subprocess.PIPE,
            )  # fmt: skip
            out, _ = await asyncio.to_thread(run.communicate)
            self.campaigns.append(
                {"name": name, "status": run.returncode, "result": _json(out.decode())}
            )

    async def run(self) -> dict[str, Any]:
        await asyncio.to_thread(self.cluster.start)
        await wait_for_jetstream(self.cluster.urls)
        for recorder in self.recorders:  # the first to start records, the other stands by
            recorder.start(self.cluster.url)
        await self._recorder_owns(180)  # it creates the lease buckets the actors use
        nc = await connect(self.cluster.url, "kf-soak")
        await nc.subscribe("kf.ev.>", cb=self.watch.on_event)
        await nc.subscribe(f"{HEARTBEAT_PREFIX}.*.*", cb=self.watch.on_beat)
        for role, count in CREW.items():
            for _ in range(count):
                self._start_actor(role)
        began = time.time()
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(self.run_campaigns(stop)),
            asyncio.create_task(self.kill_actors(stop)),
            asyncio.create_task(self.kill_nodes(stop, nc)),
            asyncio.create_task(self.supervise_recorders(stop)),
            asyncio.create_task(self.supervise_actors(stop)),
        ]
        await asyncio.sleep(self.minutes * 60)
        stop.set()  # the campaign running now finishes; no new one starts
        await asyncio.gather(*tasks)
        ended = time.time()
        await asyncio.sleep(3)  # the last events reach the recorder
        for process in self.actors.values():
            process.send_signal(signal.SIGTERM)
        for process in self.actors.values():
            await asyncio.to_thread(process.wait)
        await nc.close()
        for recorder in self.recorders:
            await asyncio.to_thread(recorder.stop)
        await asyncio.to_thread(self.cluster.stop)
        return self.figures(ended - began)

    def figures(self, seconds: float) -> dict[str, Any]:
        store = duckdb.connect(str(_last_owner(self.recorders)), read_only=True)
        rows = store.execute(
            "SELECT event_id, type, epoch(ts), payload->>'candidate_id', "
            "payload->>'stage' FROM events WHERE campaign_id LIKE 'soak-%'"
        ).fetchall()
        all_ids = {r[0] for r in store.execute("SELECT event_id FROM events").fetchall()}
        repeated = store.execute(
            "SELECT count(*) - count(DISTINCT event_id) FROM events"
        ).fetchone()
        store.close()
        proposed: dict[str, float] = {}
        settled: dict[str, float] = {}
        evaluations: dict[tuple[str, str], int] = {}
        for _, kind, ts, candidate, stage in rows:
            if candidate is None:
                continue
            if kind == "CandidateProposed":
                proposed[candidate] = ts
            if kind in SETTLING:
                settled.setdefault(candidate, ts)
            if kind in ("KernelVerified", "BenchmarkCompleted") or (
                kind == "KernelRejected" and stage != "benchmark"
            ):
                key = (candidate, "timed" if kind == "BenchmarkCompleted" else "verified")
                evaluations[key] = evaluations.get(key, 0) + 1
        per_candidate = self._overheads(rows)
        overheads = [o for o in per_candidate.values() if o is not None]
        lost = self.watch.published - all_ids
        return {
            "minutes": self.minutes,
            "seconds": round(seconds, 1),
            "campaigns": len(self.campaigns),
            "campaigns_finished": sum(c["status"] == 0 for c in self.campaigns),
            "candidates_settled": len(settled),
            "settled_per_second": round(len(settled) / seconds, 3),
            "overhead_ms_p50": _ms(_quantile(overheads, 0.5)),
            "overhead_ms_p99": _ms(_quantile(overheads, 0.99)),
            "overhead_samples": len(overheads),
            "overhead_ms_by_candidate": {c: _ms(o) for c, o in sorted(per_candidate.items())},
            "events_published": len(self.watch.published),
            "events_lost": len(lost),
            "lost_ids": sorted(lost)[:20],
            "stored_twice": int(repeated[0]) if repeated else 0,
            "duplicate_evaluations": sum(n > 1 for n in evaluations.values()),
            "recoveries": [asdict(r) for r in self.recoveries],
            "unrecovered": sum(r.seconds is None for r in self.recoveries),
        }

    def _overheads(self, rows: list[tuple[Any, ...]]) -> dict[str, float | None]:
        """Per candidate, the sum over its hops of (start - max(work there, taker free))."""
        jobs = _jobs(self.watch.beats)
        ready = {(r[3], r[1]): r[2] for r in rows if r[3] is not None and r[1] in HOPS}
        total: dict[str, float | None] = {}
        for (candidate, kind), there in ready.items():
            job = jobs.get(f"{kind} {candidate}")
            if job is None:  # not seen started (its taker was killed, a beat missed)
                total[candidate] = None
                continue
            start, free_since = job
            hop = max(0.0, start - max(there, free_since))
            if candidate in total and total[candidate] is None:
                continue
            total[candidate] = (total.get(candidate) or 0.0) + hop
        return total


class Recorder:
    """A `kfactory server --nats` process and its run folder; started again when it exits."""

    def __init__(self, home: Path, logs: Path) -> None:
        self.home = home
        self.log = logs / f"{home.name}.log"
        self.out = logs / f"{home.name}.out"
        self.process: subprocess.Popen[bytes] | None = None
        self._urls_at_start = 0

    def _urls(self) -> int:
        """How many times it has printed its URL: once each time it took the lease."""
        if not self.out.exists():
            return 0
        return self.out.read_text().count("nats://")

    def start(self, url: str) -> None:
        self._urls_at_start = self._urls()
        with self.out.open("ab") as out:
            self.process = _kfactory(
                ["server", "--nats", url, "--home", str(self.home)], self.log, stdout=out.fileno()
            )

    def owns(self) -> bool:
        """Whether this process took the recording lease since it started."""
        return self._urls() > self._urls_at_start

    def last_words(self) -> str:
        lines = self.log.read_text(errors="replace").strip().splitlines()
        return lines[-1][:200] if lines else f"exited with {self.process and self.process.poll()}"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait()


def _last_owner(recorders: list[Recorder]) -> Path:
    """The store written under the newest fencing token: the complete record."""
    best: tuple[int, Path] | None = None
    for recorder in recorders:
        path = recorder.home / "events.duckdb"
        if not path.exists():
            continue
        store = DuckDBEventStore(path, read_only=True)
        try:
            token = store.fence.token if store.fence is not None else -1
        finally:
            store.close()
        if best is None or token > best[0]:
            best = (token, path)
    if best is None:
        raise RuntimeError("no recorder wrote a store")
    return best[1]


def _jobs(beats: list[Heartbeat]) -> dict[str, tuple[float, float]]:
    """Each job's first start, and since when its instance had been free (its previous
    job's end, as its beats say)."""
    found: dict[str, tuple[float, float]] = {}
    last: dict[str, Heartbeat] = {}
    free_since: dict[str, float] = {}
    for beat in sorted(beats, key=lambda b: b.sent):
        before = last.get(beat.instance)
        if before is not None and before.job and before.job != beat.job:
            free_since[beat.instance] = beat.sent  # the previous job ended by now
        if beat.job and (before is None or before.job != beat.job):
            found.setdefault(beat.job, (beat.sent, free_since.get(beat.instance, 0.0)))
        last[beat.instance] = beat
    return found


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def print_table(figures: dict[str, Any]) -> None:
    rows = [
        ("soak", f"{figures['minutes']} min ({figures['seconds']} s)"),
        ("campaigns finished", f"{figures['campaigns_finished']} of {figures['campaigns']}"),
        ("candidates settled", str(figures["candidates_settled"])),
        ("settled per second", str(figures["settled_per_second"])),
        ("overhead p50 / p99 (ms)",
         f"{figures['overhead_ms_p50']} / {figures['overhead_ms_p99']} "
         f"({figures['overhead_samples']} candidates)"),
        ("events lost", f"{figures['events_lost']} of {figures['events_published']}"),
        ("stored twice", str(figures["stored_twice"])),
        ("duplicate evaluations", str(figures["duplicate_evaluations"])),
        ("unrecovered kills", f"{figures['unrecovered']} of {len(figures['recoveries'])}"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    for r in figures["recoveries"]:
        took = "never" if r["seconds"] is None else f"{r['seconds']:.2f} s"
        led = r["stream_led_after"]
        extra = "" if led is None else f" (stream led from another node after {led:.2f} s)"
        print(f"  recovered {r['what']:<28} {took}{extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1, help="Which actors and nodes die.")
    parser.add_argument("--actor-kill-every", type=float, default=ACTOR_KILL_EVERY)
    parser.add_argument("--node-kill-every", type=float, default=NODE_KILL_EVERY)
    parser.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    parser.add_argument("--keep", type=Path, help="Run in this folder and keep it.")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        soak = Soak(
            folder / "soak", args.minutes, args.seed, args.actor_kill_every, args.node_kill_every
        )
        figures = asyncio.run(soak.run())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print_table(figures)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
