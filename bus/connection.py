"""Connections that outlive server restarts of any length, and that a stop ends at once.

nats-py gives up after 60 reconnect attempts (about two minutes) by default; every
Kernel Factory connection retries forever once connected. Before the first connection,
actors wait for the hub as long as it takes (logging `waiting for the hub at URL` every
`WAITING_LOG_EVERY` s), while interactive commands (`run --nats`, `sql`, `events`, `ps`)
give up after `INTERACTIVE_WAIT` (10 s) with one line naming the URL. Setting `stop`
(SIGINT or SIGTERM), or cancelling the call, ends the wait at once. A server that refuses
the credentials is not waited for: `connect` raises AuthError at once, naming the seed
file. `auth` gives the user's nkey seed and the CA that signed the server's TLS
certificate. `id_key(nc)` is the key the connection's user derives event ids with
(`bus.auth.event_id_key`: from its seed; empty for a connection without one).

`jetstream` addresses the JetStream domain of `$KF_JS_DOMAIN` when set: a client of a GPU
host's leaf node reaches the cluster's JetStream only as `$JS.<domain>.API`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import weakref

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from bus.auth import AuthError, ClientAuth, event_id_key

log = structlog.get_logger("bus.connection")

#: How often a process that waits for the hub forever says so.
WAITING_LOG_EVERY = 30.0
#: How long interactive commands (sql, events tail, run --nats, ps) wait for the hub.
INTERACTIVE_WAIT = 10.0
#: The JetStream domain of the cluster, for clients of a leaf node (a GPU host's): their
#: JetStream requests go to `$JS.<domain>.API.>`, the only API prefix that crosses a leaf
#: connection. Empty or unset: `$JS.API`.
JS_DOMAIN_ENV = "KF_JS_DOMAIN"


#: Each connection's event-id key, read from its seed file when it connected.
_ID_KEYS: weakref.WeakKeyDictionary[Client, bytes] = weakref.WeakKeyDictionary()


class ConnectStopped(Exception):
    """The stop flag was set while connecting."""


async def connect(
    url: str,
    name: str,
    *,
    wait_for_server: float | None = 30.0,
    stop: asyncio.Event | None = None,
    reconnect_wait: float = 0.25,
    auth: ClientAuth | None = None,
) -> Client:
    """Connect to `url` (comma-separated for a cluster).

    Waits `wait_for_server` seconds for a server (None: forever, logging "waiting for the
    hub at URL" every 30 s) and raises ConnectionError after that; raises ConnectStopped
    as soon as `stop` is set, and AuthError when the server refuses the credentials.
    """

    refused = asyncio.Event()
    last_error = ""

    async def on_error(exc: Exception) -> None:
        nonlocal last_error
        text = last_error = str(exc) or type(exc).__name__
        if "authorization violation" in text.lower() or "authentication" in text.lower():
            refused.set()
        elif "permissions violation" in text.lower():
            log.warning("the server refused an operation", client=name, error=text)
            return
        log.debug("nats connection error", client=name, error=text)

    async def on_disconnected() -> None:
        if not (nc.is_closed or nc.is_draining or nc.is_draining_pubs):
            log.info("nats disconnected; reconnecting", client=name)

    async def on_reconnected() -> None:
        log.info(
            "nats reconnected",
            client=name,
            url=str(nc.connected_url.netloc if nc.connected_url else ""),
        )

    auth = auth or ClientAuth()
    secure: dict[str, object] = {"inbox_prefix": auth.inbox_prefix}
    if auth.seed_file is not None:
        secure["nkeys_seed"] = str(auth.seed_file)
    context = auth.tls_context()
    if context is not None:
        secure["tls"] = context
    key = event_id_key(auth.seed_file)
    nc = Client()
    connecting = asyncio.ensure_future(
        nc.connect(
            servers=[u.strip() for u in url.split(",") if u.strip()],
            name=name,
            allow_reconnect=True,
            max_reconnect_attempts=-1,  # also retries the first connection, forever
            reconnect_time_wait=reconnect_wait,  # type: ignore[arg-type]
            connect_timeout=2,
            ping_interval=5,
            max_outstanding_pings=3,
            pending_size=64 * 1024 * 1024,
            error_cb=on_error,
            disconnected_cb=on_disconnected,
            reconnected_cb=on_reconnected,
            **secure,  # type: ignore[arg-type]
        )
    )
    watched = {connecting, asyncio.ensure_future(refused.wait())}
    if stop is not None:
        watched.add(asyncio.ensure_future(stop.wait()))
    started = time.monotonic()
    next_note = started + WAITING_LOG_EVERY
    try:
        while not connecting.done():
            now = time.monotonic()
            wake = next_note if wait_for_server is None else started + wait_for_server
            await asyncio.wait(
                watched, timeout=max(wake - now, 0.0), return_when=asyncio.FIRST_COMPLETED
            )
            if connecting.done():
                break
            if refused.is_set():
                raise AuthError(
                    f"{url} refused the connection: "
                    + (
                        f"the credentials in {auth.seed_file} are not accepted"
                        if auth.seed_file
                        else "it requires credentials (--creds FILE, from `kfactory creds ROLE`)"
                    )
                )
            if stop is not None and stop.is_set():
                raise ConnectStopped(f"stopped while connecting to {url}")
            waited = time.monotonic() - started
            if wait_for_server is not None and waited >= wait_for_server:
                raise ConnectionError(
                    f"no NATS server reachable at {url} after {wait_for_server:.0f} s"
                    + (f" ({last_error})" if last_error else "")
                )
            if time.monotonic() >= next_note:
                log.warning(f"waiting for the hub at {url}", client=name, waited_s=round(waited))
                next_note += WAITING_LOG_EVERY
        await connecting
    except BaseException as exc:
        connecting.cancel()
        with contextlib.suppress(BaseException):
            await connecting
        with contextlib.suppress(Exception):
            await nc.close()
        if isinstance(exc, Exception) and not isinstance(
            exc, (AuthError, ConnectStopped, ConnectionError)
        ):
            raise ConnectionError(f"could not connect to {url}: {exc}") from exc
        raise
    finally:
        for waiter in watched - {connecting}:
            waiter.cancel()
    _ID_KEYS[nc] = key
    return nc


def id_key(nc: Client) -> bytes:
    """The key `nc`'s user derives event ids with: empty for a connection made without a
    seed file (no users on the bus), or not made by `connect`."""
    return _ID_KEYS.get(nc, b"")


def jetstream_domain() -> str | None:
    """The JetStream domain this process addresses ($KF_JS_DOMAIN), None for none."""
    return os.environ.get(JS_DOMAIN_ENV, "").strip() or None


def jetstream(nc: Client, timeout: float = 5.0, domain: str | None = None) -> JetStreamContext:
    """JetStream through `nc`, in `domain` (default: $KF_JS_DOMAIN)."""
    return nc.jetstream(
        timeout=timeout,
        publish_async_max_pending=20_000,
        domain=domain or jetstream_domain(),
    )


__all__ = [
    "INTERACTIVE_WAIT",
    "JS_DOMAIN_ENV",
    "Client",
    "ConnectStopped",
    "JetStreamContext",
    "Msg",
    "connect",
    "jetstream",
    "jetstream_domain",
]
