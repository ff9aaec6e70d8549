"""The hub: embedded nats-server (unless a URL is given), the recorder owning the DuckDB
file, and the read-only SQL service. `kfactory server` runs it in the foreground;
`kfactory run` and the tests run it in-process.

Recording has one owner at a time. The hub takes the recording lease (key `KF_EVENTS`
in the bucket `KF_RECORDER_LEASE`; `RECORDER_LEASE_TTL`, 5 s, renewed every third of it)
before it opens its store; a second hub on the same NATS waits as a standby until the
lease expires or is released, saying so every `STANDBY_LOG_EVERY` (60 s). Each hub has its
own store: a standby's file is on its own host, and a hub that takes over reads the
stream from its own store's cursor, catching up with everything its file lacks, then
live, while it already answers queries from what it holds. The recorder writes every
batch under the lease's fencing token (`eventstore/recorder.py`); what a deposed
`kfactory server` does is `ops/server_cmd.py`'s.

The embedded server's port is chosen once and kept in `<home>/nats/port`, so a restarted
hub keeps its URL. The hub looks at its nats-server child every `SUPERVISE_EVERY` (0.5 s);
if it died, the hub starts it again on that port and store, logging the exit and the
restart, and clients reconnect.

The embedded server always authenticates (unless `auth=False` on loopback): every user
of `ops/accounts.py` gets its seed in the run folder on first start, and the server's
configuration grants each only its own subjects. With `tls`, clients must use TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import structlog

from bus.auth import AuthError, ClientAuth, TlsFiles, is_loopback, server_config, write_private
from bus.connection import Client, ConnectStopped, connect, jetstream
from bus.lease import (
    DEVICE_LEASES,
    RECORDER_LEASES,
    AcquireStopped,
    HeldLease,
    LeaseBucket,
    LeaseLost,
    ensure_lease_bucket,
)
from bus.server import EmbeddedNatsServer, NatsServerError
from bus.streams import ensure_events_stream
from bus.subjects import STREAM
from eventstore.duckdb_store import DuckDBEventStore, StoreLocked
from eventstore.queries import serve_queries
from eventstore.recorder import Recorder
from eventstore.store import FencedOut
from ops.accounts import (
    ADMIN,
    HUB,
    client_auth,
    ensure_credentials,
    known_askers,
    permissions,
)
from ops.home import ServerInfo, clear_server_info, store_path, write_server_info

log = structlog.get_logger("ops.hub")

#: How often the hub looks whether its nats-server child is still there.
SUPERVISE_EVERY = 0.5
#: Seconds the recording lease lasts unrenewed: how long a standby waits after the
#: owner's last renewal (it renews every third of it).
RECORDER_LEASE_TTL = 5
#: The one key of the recording lease: one recorder per event stream.
RECORDER_KEY = STREAM
#: How often a standby says it is still waiting.
STANDBY_LOG_EVERY = 60.0


@dataclass
class Hub:
    url: str
    store: DuckDBEventStore
    recorder: Recorder
    nc: Client
    server: EmbeddedNatsServer | None
    recording: asyncio.Task[None]
    home: Path
    ca_file: Path | None = None
    external_auth: ClientAuth | None = None
    lease: HeldLease | None = None

    def auth(self, user: str) -> ClientAuth:
        """How a process of this host connects as `user` (the run folder's seed)."""
        if self.external_auth is not None:
            return self.external_auth
        return client_auth(self.home, user, self.ca_file)

    def check(self) -> None:
        """Raise the recorder's failure, if it died, or LeaseLost once it was deposed."""
        if self.recording.done() and not self.recording.cancelled():
            error = self.recording.exception()
            if isinstance(error, (LeaseLost, FencedOut)):
                raise error
            if error is not None:
                raise RuntimeError(f"the recorder stopped: {error!r}") from error
        if self.lease is not None:
            self.lease.check()

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
                    async with asyncio.timeout(min(left, 0.5)):
                        await self.recorder.committed.wait()
        return self.store.last_position


@contextlib.asynccontextmanager
async def running_hub(
    home: Path,
    *,
    nats_url: str | None = None,
    listen: str = "127.0.0.1",
    port: int = -1,
    store: Path | None = None,
    auth: bool = True,
    tls: TlsFiles | None = None,
    ca_file: Path | None = None,
    external_auth: ClientAuth | None = None,
    stop: asyncio.Event | None = None,
    lease_ttl: int = RECORDER_LEASE_TTL,
) -> AsyncIterator[Hub]:
    """Start the hub; on exit, record what has arrived, then stop everything.

    `ca_file` is the CA local clients verify the server's certificate with;
    `external_auth` is how the hub joins an existing NATS (`nats_url`, comma-separated
    for a cluster), which it waits for as long as it takes, or until `stop` is set.

    Recording has one owner at a time: the hub takes the recording lease (`lease_ttl`
    seconds, renewed in the background) before it opens its store; while another hub
    holds it, this one waits as a standby (ConnectStopped if `stop` is set meanwhile).
    """
    async with contextlib.AsyncExitStack() as stack:  # released in reverse order
        server = None
        if nats_url is None:
            server = _embedded_server(home, listen, port, auth, tls)
            await asyncio.to_thread(_start_on_kept_port, server, home)
            stack.push_async_callback(asyncio.to_thread, server.stop)
            stack.push_async_callback(_cancelled, asyncio.create_task(supervise(server)))
            nats_url = server.url
        hub_auth, admin_auth = _client_auths(home, server, auth, ca_file, external_auth)
        path = store or store_path(home)
        wait = None if server is None else 30.0
        await _ensure_streams(nats_url, admin_auth, wait, stop)
        nc = await connect(nats_url, "kf-recorder", wait_for_server=wait, stop=stop, auth=hub_auth)
        stack.push_async_callback(_closed, nc)
        leases = await LeaseBucket.open(jetstream(nc), RECORDER_LEASES, lease_ttl)
        holder = f"{socket.gethostname()}:{path}"
        lease = await stack.enter_async_context(_recording_lease(leases, holder, stop))
        event_store = await _open_store(path, lease, stop)
        stack.callback(event_store.close)
        recorder = Recorder(nc, event_store, lease=lease)
        stop_recording = asyncio.Event()
        recording = asyncio.create_task(recorder.run(stop_recording))
        # record what has arrived while the lease is still ours
        stack.push_async_callback(_recorded, recording, stop_recording)
        askers = (known_askers(home) or None) if auth else None
        service = await serve_queries(nc, event_store, askers)
        stack.push_async_callback(service.stop)
        write_server_info(
            home,
            ServerInfo(
                url=nats_url,
                pid=os.getpid(),
                store=str(event_store.path),
                ca=str(ca_file) if ca_file else None,
            ),
        )
        stack.callback(clear_server_info, home, os.getpid())
        yield Hub(
            nats_url,
            event_store,
            recorder,
            nc,
            server,
            recording,
            home,
            ca_file,
            None if server is not None else external_auth,
            lease,
        )


def _client_auths(
    home: Path,
    server: EmbeddedNatsServer | None,
    auth: bool,
    ca_file: Path | None,
    external_auth: ClientAuth | None,
) -> tuple[ClientAuth, ClientAuth]:
    """How the hub's recorder and its admin connect: (hub, admin)."""
    if (server is not None and auth) or (
        server is None and (external_auth is None or external_auth.seed_file is None)
    ):
        # the embedded server's users, or those of a cluster `kfactory deploy` rendered here
        return client_auth(home, HUB, ca_file), client_auth(home, ADMIN, ca_file)
    shared = external_auth or ClientAuth(None, ca_file)
    return shared, shared


async def _ensure_streams(
    url: str, auth: ClientAuth, wait: float | None, stop: asyncio.Event | None
) -> None:
    """The events stream and the lease buckets, made by the admin (only the admin manages
    them) before anyone publishes through the hub."""
    async with await connect(url, "kf-admin", wait_for_server=wait, stop=stop, auth=auth) as admin:
        events = await ensure_events_stream(jetstream(admin))
        for bucket in (RECORDER_LEASES, DEVICE_LEASES):  # as replicated as the events
            await ensure_lease_bucket(
                jetstream(admin), bucket, replicas=events.config.num_replicas or 1
            )


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


async def _closed(nc: Client) -> None:
    """Drain the connection (a second at most), then close it."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            await nc.drain()
    if not nc.is_closed:
        await nc.close()


async def _recorded(recording: asyncio.Task[None], stop_recording: asyncio.Event) -> None:
    """Stop the recorder once it has stored what has arrived (30 s at most)."""
    stop_recording.set()
    with contextlib.suppress(Exception):
        async with asyncio.timeout(30):
            await recording


@contextlib.asynccontextmanager
async def _recording_lease(
    leases: LeaseBucket, holder: str, stop: asyncio.Event | None
) -> AsyncIterator[HeldLease]:
    """Hold the recording lease, waiting as a standby (and saying so) while another has it."""
    waiting: asyncio.Task[None] | None = None
    current = await leases.current(RECORDER_KEY)
    if current is not None:
        log.warning(
            "standby: another recorder holds the lease; taking over when it expires"
            if current.holder != holder
            else "standby: this store's previous recorder (killed?) holds the lease; "
            "taking over when it expires",
            holder=current.holder,
            token=current.token,
            ttl_s=leases.ttl,
        )
        waiting = asyncio.create_task(_say_still_waiting(leases))
    try:
        async with leases.held(RECORDER_KEY, holder, stop=stop) as lease:
            if waiting is not None:
                waiting.cancel()
            log.info("recording lease taken", holder=holder, token=lease.token, ttl_s=leases.ttl)
            yield lease
    except AcquireStopped as exc:
        raise ConnectStopped(str(exc)) from exc
    finally:
        if waiting is not None:
            waiting.cancel()


async def _say_still_waiting(leases: LeaseBucket) -> None:
    while True:
        await asyncio.sleep(STANDBY_LOG_EVERY)
        current = await leases.current(RECORDER_KEY)
        log.info("standby", holder=current.holder if current else None)


async def _open_store(path: Path, lease: HeldLease, stop: asyncio.Event | None) -> DuckDBEventStore:
    """Open the store read-write, waiting while another process still has the file (a
    deposed recorder on this host that has not noticed yet)."""
    said = False
    while True:
        lease.check()
        if stop is not None and stop.is_set():
            raise ConnectStopped(f"stopped while waiting for {path}")
        try:  # in a thread: opening a large file takes a while, and the lease is renewed
            return await asyncio.to_thread(DuckDBEventStore, path)
        except StoreLocked as exc:
            if not said:
                log.warning("waiting for the store's file", error=str(exc))
                said = True
            await asyncio.sleep(0.25)


def port_file(home: Path) -> Path:
    return home / "nats" / "port"


def _start_on_kept_port(server: EmbeddedNatsServer, home: Path) -> None:
    """Start on the port this run folder kept (or on a free one, then kept)."""
    kept = port_file(home)
    if server.port <= 0:
        with contextlib.suppress(OSError, ValueError):
            server.port = int(kept.read_text().strip())
    try:
        server.start()
    except NatsServerError as exc:
        raise NatsServerError(
            f"{exc} (the port {server.port} is kept in {kept}; free it, or remove that file "
            "to take a new port and a new URL)"
            if kept.exists()
            else str(exc)
        ) from exc
    kept.write_text(f"{server.port}\n")


async def supervise(server: EmbeddedNatsServer) -> None:
    """Start the nats-server child again, on the same port and store, whenever it dies."""
    while True:
        await asyncio.sleep(SUPERVISE_EVERY)
        code = server.exit_code
        if code is None:
            continue
        log.warning("nats-server exited; restarting it", code=code, url=server.url)
        try:
            await asyncio.to_thread(server.start)
            log.warning("nats-server restarted", url=server.url, pid=server.pid)
        except NatsServerError as exc:
            log.error("nats-server did not restart; trying again", error=str(exc))
            await asyncio.sleep(2.0)


def _embedded_server(
    home: Path, listen: str, port: int, auth: bool, tls: TlsFiles | None
) -> EmbeddedNatsServer:
    if not auth and not is_loopback(listen):
        raise AuthError(
            f"refusing to listen on {listen} without authentication: drop --no-auth "
            f"(each role's credentials are then created in {home / 'creds'} and handed out "
            "with `kfactory creds ROLE -o FILE`)"
        )
    folder = home / "nats"
    config = None
    if auth or tls is not None:
        if auth:
            ensure_credentials(home)
        config = folder / "nats-server.conf"
        users = permissions(home) if auth else {}
        text = server_config(users, tls)
        write_private(config, text.encode())
    return EmbeddedNatsServer(folder, host=listen, port=port, config_file=config)
