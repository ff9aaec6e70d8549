"""Connections that outlive server restarts of any length.

nats-py gives up after 60 reconnect attempts (about two minutes) by default; every
Kernel Factory connection retries forever instead, and also waits for a server that
is not up yet when the process starts. `auth` gives the user's nkey seed and the CA
that signed the server's TLS certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoServersError
from nats.js import JetStreamContext

from bus.auth import AuthError, ClientAuth

log = structlog.get_logger("bus.connection")


async def connect(
    url: str,
    name: str,
    *,
    wait_for_server: float = 30.0,
    reconnect_wait: float = 0.25,
    auth: ClientAuth | None = None,
) -> Client:
    """Connect to `url` (comma-separated for a cluster), retrying for `wait_for_server` s."""

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
    deadline = time.monotonic() + wait_for_server
    while True:
        nc = Client()
        connecting = asyncio.ensure_future(
            nc.connect(
                servers=[u.strip() for u in url.split(",") if u.strip()],
                name=name,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
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
        refusal = asyncio.ensure_future(refused.wait())
        await asyncio.wait(
            {connecting, refusal},
            timeout=max(deadline - time.monotonic(), 0) + 5,
            return_when=asyncio.FIRST_COMPLETED,
        )
        refusal.cancel()
        if not connecting.done() and not refused.is_set():  # e.g. a TLS handshake that fails
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await connecting
            with contextlib.suppress(Exception):
                await nc.close()
            raise ConnectionError(f"could not connect to {url}: {last_error or 'timed out'}")
        if refused.is_set():
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await connecting
            with contextlib.suppress(Exception):
                await nc.close()
            raise AuthError(
                f"{url} refused the connection: "
                + (
                    f"the credentials in {auth.seed_file} are not accepted"
                    if auth.seed_file
                    else "it requires credentials (--creds FILE, from `kfactory creds ROLE`)"
                )
            )
        try:
            await connecting
            return nc
        except (TimeoutError, NoServersError, OSError) as exc:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"no NATS server reachable at {url}: {exc}") from exc
            await asyncio.sleep(0.25)


def jetstream(nc: Client, timeout: float = 5.0) -> JetStreamContext:
    return nc.jetstream(timeout=timeout, publish_async_max_pending=20_000)


__all__ = ["Client", "JetStreamContext", "Msg", "connect", "jetstream"]
