"""The hub: embedded nats-server (unless a URL is given), the recorder owning the DuckDB
file, and the read-only SQL service. `kfactory server` runs it in the foreground;
`kfactory run` and the tests run it in-process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from nats.aio.client import Client

from bus.connection import connect, jetstream
from bus.server import EmbeddedNatsServer
from bus.streams import ensure_events_stream
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.queries import serve_queries
from eventstore.recorder import Recorder
from ops.home import ServerInfo, clear_server_info, store_path, write_server_info


@dataclass
class Hub:
    url: str
    store: DuckDBEventStore
    recorder: Recorder
    nc: Client
    server: EmbeddedNatsServer | None
    recording: asyncio.Task[None]

    def check(self) -> None:
        """Raise the recorder's failure, if it died."""
        if self.recording.done() and not self.recording.cancelled():
            error = self.recording.exception()
            if error is not None:
                raise RuntimeError(f"the recorder stopped: {error!r}") from error

    async def wait_for_position(self, position: int, timeout: float = 30.0) -> int:
        """Wait until the store holds at least `position` events; returns the position."""
        deadline = time.monotonic() + timeout
        async with self.recorder.committed:
            while self.store.last_position < position:
                self.check()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"store at position {self.store.last_position}, expected {position}"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.recorder.committed.wait(), min(left, 0.5))
        return self.store.last_position


@contextlib.asynccontextmanager
async def running_hub(
    home: Path,
    *,
    nats_url: str | None = None,
    listen: str = "127.0.0.1",
    port: int = -1,
    store: Path | None = None,
) -> AsyncIterator[Hub]:
    """Start the hub; on exit, record what has arrived, then stop everything."""
    server = None
    if nats_url is None:
        server = EmbeddedNatsServer(home / "nats", host=listen, port=port)
        await asyncio.to_thread(server.start)
        nats_url = server.url
    event_store = DuckDBEventStore(store or store_path(home))
    nc: Client | None = None
    stop = asyncio.Event()
    recording: asyncio.Task[None] | None = None
    try:
        nc = await connect(nats_url, "kf-recorder")
        await ensure_events_stream(jetstream(nc))  # before anyone publishes through us
        recorder = Recorder(nc, event_store)
        recording = asyncio.create_task(recorder.run(stop))
        service = await serve_queries(nc, event_store)
        write_server_info(
            home, ServerInfo(url=nats_url, pid=os.getpid(), store=str(event_store.path))
        )
        try:
            yield Hub(nats_url, event_store, recorder, nc, server, recording)
        finally:
            clear_server_info(home, os.getpid())
            await service.stop()
    finally:
        stop.set()
        if recording is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(recording, 30)
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.drain()
        event_store.close()
        if server is not None:
            await asyncio.to_thread(server.stop)
