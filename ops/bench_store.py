"""The event-store benchmark behind `kfactory bench store` and `bench/store.py`.

Three figures, each measured in this run on this machine:
- ingest: events published through NATS (acked by JetStream) and committed in DuckDB
  by a recorder in its own process, from the first publish to the last commit;
- replay: reading and decoding 1,000,000 stored events;
- SQL: latency of typical read-only queries over request/reply on that store.

With `secure`, ingest is measured again in the same run against a server that requires
nkey credentials, then one that also requires TLS (the publisher as the benchmarker, the
recorder as the hub), so the figures can be compared.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bus.auth import ClientAuth, TlsFiles, server_config, write_private
from bus.connection import connect, jetstream
from bus.publisher import OutgoingMessage, Publisher
from bus.server import EmbeddedNatsServer
from bus.streams import ensure_events_stream
from eventstore.codec import encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.emitter import outgoing
from eventstore.events import ActorRef, BenchmarkCompleted, Event, new_event
from eventstore.queries import StoreUnavailable, query, status
from eventstore.store import Recorded
from ops.home import store_path

REPLAY_EVENTS = 1_000_000
CAMPAIGNS = 20

SQL_MIX = {
    "count_by_type": "SELECT type, count(*) FROM events GROUP BY type",
    "campaign_tail": (
        "SELECT position, type, ts FROM events WHERE campaign_id = 'bench-7' "
        "ORDER BY position DESC LIMIT 50"
    ),
    "event_by_id": "SELECT payload FROM events WHERE event_id = '{event_id}'",
    "campaign_best": (
        "SELECT payload->>'source_hash' AS kernel, max(CAST(payload->>'speedup' AS DOUBLE)) "
        "AS best FROM events WHERE campaign_id = 'bench-3' AND type = 'BenchmarkCompleted' "
        "GROUP BY kernel ORDER BY best DESC LIMIT 10"
    ),
    "events_per_minute": (
        "SELECT date_trunc('minute', ts) AS minute, count(*) FROM events "
        "GROUP BY minute ORDER BY minute DESC LIMIT 10"
    ),
}


def sample_events(count: int, start: int = 0) -> list[Event]:
    """Events shaped like the ones a campaign records most: benchmark results."""
    actor = ActorRef(role="benchmarker", instance="benchmarker-1", host="bench-host")
    return [
        new_event(
            BenchmarkCompleted,
            campaign_id=f"bench-{i % CAMPAIGNS}",
            actor=actor,
            problem="softmax",
            target="cpu",
            candidate_id=f"bench-{i % CAMPAIGNS}:g{i // 1000}:c{i % 1000}",
            generation=i // 1000,
            device="bench-host",
            source_hash=f"{i:064x}",
            median_ns=4_700_000.0 + i % 1000,
            iqr_ns=12_000.0,
            baseline="numpy",
            baseline_ns=96_000_000.0,
            speedup=20.4 + (i % 100) / 100,
            roofline_fraction=0.81,
        )
        for i in range(start, start + count)
    ]


def _recorder_process(home: Path, url: str, auth: ClientAuth) -> subprocess.Popen[bytes]:
    secure = ["--creds", str(auth.seed_file)] if auth.seed_file else []
    secure += ["--tls-ca", str(auth.ca_file)] if auth.ca_file else []
    return subprocess.Popen(
        [sys.executable, "-m", "ops.cli", "server", "--home", str(home), "--nats", url, *secure],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _wait_position(
    url: str, position: int, timeout: float, auth: ClientAuth
) -> tuple[float, int]:
    """Poll the store owner until it holds `position` events: (when, position then)."""
    nc = await connect(url, "bench-poll", auth=auth)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                now = (await status(nc, timeout=2)).last_position
            except StoreUnavailable:
                now = -1
            if now >= position:
                return time.perf_counter(), now
            await asyncio.sleep(0.005)
    finally:
        await nc.close()
    raise TimeoutError(f"the recorder did not reach {position} events in {timeout:.0f}s")


async def _publish(publisher: Publisher, messages: list[OutgoingMessage]) -> None:
    for chunk in range(0, len(messages), 10_000):
        await publisher.publish_many(messages[chunk : chunk + 10_000])


class _Users:
    """Who each side of the benchmark connects as (nobody in particular without auth)."""

    def __init__(self, admin: ClientAuth, publisher: ClientAuth, hub: ClientAuth) -> None:
        self.admin, self.publisher, self.hub = admin, publisher, hub


async def _ingest(
    url: str, messages: list[OutgoingMessage], home: Path, users: _Users
) -> dict[str, float]:
    """Three phases: publish alone; the recorder catches up alone; both at once."""
    admin = await connect(url, "bench-admin", auth=users.admin)
    await ensure_events_stream(jetstream(admin))
    await admin.close()
    nc = await connect(url, "bench-publisher", auth=users.publisher)
    js = jetstream(nc)
    publisher = Publisher(js)
    half = len(messages) // 2
    backlog, live = messages[:half], messages[half:]
    t0 = time.perf_counter()
    await _publish(publisher, backlog)
    published = time.perf_counter() - t0

    recorder = _recorder_process(home, url, users.hub)
    try:
        t_up, at_up = await _wait_position(url, 0, 60, users.hub)
        t_done, _ = await _wait_position(url, half, 600, users.hub)
        recorded = (half - at_up) / (t_done - t_up)

        waiting = asyncio.create_task(_wait_position(url, len(messages), 600, users.hub))
        t1 = time.perf_counter()
        await _publish(publisher, live)
        t_both, _ = await waiting
        end_to_end = len(live) / (t_both - t1)
    finally:
        recorder.terminate()
        recorder.wait(60)
        await nc.close()
    return {
        "ingest_events": len(messages),
        "publish_events_per_s": half / published,
        "ingest_events_per_s": recorded,
        "end_to_end_events_per_s": end_to_end,
    }


def _top_up(path: Path, total: int, report: Callable[[str], None]) -> None:
    store = DuckDBEventStore(path)
    try:
        have = store.last_position
        while have < total:
            n = min(50_000, total - have)
            store.append([Recorded(e, encode(e)) for e in sample_events(n, have)])
            have += n
        report(f"store holds {store.last_position:,} events")
    finally:
        store.close()


def _replay(path: Path, repeats: int) -> tuple[float, int]:
    store = DuckDBEventStore(path, read_only=True)
    times = []
    count = 0
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            count = sum(1 for _ in store.replay())
            times.append(time.perf_counter() - t0)
    finally:
        store.close()
    return statistics.median(times), count


async def _sql(home: Path, url: str, repeats: int) -> dict[str, Any]:
    store = DuckDBEventStore(store_path(home), read_only=True)
    event_id = store.query("SELECT event_id FROM events WHERE position = 500000").rows
    store.close()
    recorder = _recorder_process(home, url, ClientAuth())
    nc = await connect(url, "bench-sql")
    per_query: dict[str, list[float]] = {name: [] for name in SQL_MIX}
    try:
        await _wait_position(url, 0, 120, ClientAuth())
        for _ in range(repeats):
            for name, sql in SQL_MIX.items():
                text = sql.format(event_id=event_id[0][0] if event_id else "")
                t0 = time.perf_counter()
                await query(nc, text)
                per_query[name].append((time.perf_counter() - t0) * 1000)
    finally:
        await nc.close()
        recorder.terminate()
        recorder.wait(60)
    everything = sorted(ms for samples in per_query.values() for ms in samples)
    return {
        "sql_p50_ms": statistics.median(everything),
        "sql_p99_ms": everything[min(len(everything) - 1, int(0.99 * len(everything)))],
        "sql_p50_ms_by_query": {k: statistics.median(v) for k, v in per_query.items()},
    }


def _secure_ingest(
    messages: list[OutgoingMessage], workdir: Path, report: Callable[[str], None], tls: bool
) -> dict[str, float]:
    """Ingest again, against a server that requires nkeys (and TLS), as the roles would."""
    from ops.accounts import ADMIN, HUB, client_auth, ensure_credentials, permissions
    from ops.selfsigned import make_tls

    home = workdir / ("secure-tls" if tls else "secure")
    certs = make_tls(home / "tls") if tls else None
    ca = certs.ca if certs else None
    ensure_credentials(home)
    config = home / "nats-server.conf"
    files = TlsFiles(certs.cert, certs.key) if certs else None
    write_private(config, server_config(permissions(home), files).encode())
    server = EmbeddedNatsServer(home / "nats", config_file=config)
    url = server.start()
    try:
        report(f"ingesting {len(messages):,} events again with auth{' and TLS' if tls else ''}")
        users = _Users(
            client_auth(home, ADMIN, ca),
            client_auth(home, "benchmarker", ca),
            client_auth(home, HUB, ca),
        )
        return asyncio.run(_ingest(url, messages, home, users))
    finally:
        server.stop()


def run_store_benchmark(
    events: int,
    replay_events: int = REPLAY_EVENTS,
    sql_repeats: int = 40,
    replay_repeats: int = 3,
    workdir: Path | None = None,
    report: Callable[[str], None] = print,
    secure: bool = False,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=workdir, prefix="kf-bench-") as tmp:
        home = Path(tmp)
        server = EmbeddedNatsServer(home / "nats")
        url = server.start()
        try:
            report(f"encoding {events:,} events")
            messages = [outgoing(e) for e in sample_events(events)]
            report(f"ingesting {events:,} events through NATS into DuckDB")
            nobody = ClientAuth()
            users = _Users(nobody, nobody, nobody)
            results: dict[str, Any] = asyncio.run(_ingest(url, messages, home, users))
            report(f"ingest: {results['ingest_events_per_s']:,.0f} events/s")
            if secure:
                server.stop()  # one server at a time: the runs get the same machine
                for tls, suffix in ((False, "auth"), (True, "auth_tls")):
                    guarded = _secure_ingest(messages, home, report, tls)
                    results |= {
                        f"{k}_{suffix}": v for k, v in guarded.items() if k != "ingest_events"
                    }
                    ratio = guarded["ingest_events_per_s"] / results["ingest_events_per_s"]
                    results[f"ingest_{suffix}_ratio"] = ratio
                    report(
                        f"ingest with {'auth and TLS' if tls else 'auth'}: "
                        f"{guarded['ingest_events_per_s']:,.0f} events/s ({ratio:.0%} of the "
                        "figure without)"
                    )
                url = server.start()
            del messages
            _top_up(store_path(home), replay_events, report)
            replay_s, replayed = _replay(store_path(home), replay_repeats)
            results |= {"replay_events": replayed, "replay_1m_s": replay_s * 1e6 / replayed}
            report(f"replay: {replayed:,} events in {replay_s:.2f}s")
            results |= asyncio.run(_sql(home, url, sql_repeats))
            report(f"sql: p50 {results['sql_p50_ms']:.1f} ms, p99 {results['sql_p99_ms']:.1f} ms")
        finally:
            server.stop()
    return results
