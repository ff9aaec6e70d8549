"""Connections that outlive server restarts of any length.

nats-py gives up after 60 reconnect attempts (about two minutes) by default; every
Kernel Factory connection retries forever instead, and also waits for a server that
is not up yet when the process starts.
"""

from __future__ import annotations

import asyncio
import time

import nats
import structlog
from nats.aio.client import Client
from nats.errors import NoServersError
from nats.js import JetStreamContext

log = structlog.get_logger("bus.connection")


async def connect(
    url: str,
    name: str,
    *,
    wait_for_server: float = 30.0,
    reconnect_wait: float = 0.25,
) -> Client:
    """Connect to `url` (comma-separated for a cluster), retrying for `wait_for_server` s."""

    async def on_error(exc: Exception) -> None:
        log.debug("nats connection error", client=name, error=str(exc) or type(exc).__name__)

    async def on_disconnected() -> None:
        if not (nc.is_closed or nc.is_draining or nc.is_draining_pubs):
            log.info("nats disconnected; reconnecting", client=name)

    async def on_reconnected() -> None:
        log.info(
            "nats reconnected",
            client=name,
            url=str(nc.connected_url.netloc if nc.connected_url else ""),
        )

    deadline = time.monotonic() + wait_for_server
    while True:
        nc = Client()
        try:
            await nc.connect(
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
            )
            return nc
        except (TimeoutError, NoServersError, OSError) as exc:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"no NATS server reachable at {url}: {exc}") from exc
            await asyncio.sleep(0.25)


def jetstream(nc: Client, timeout: float = 5.0) -> JetStreamContext:
    return nc.jetstream(timeout=timeout, publish_async_max_pending=20_000)


__all__ = ["Client", "connect", "jetstream", "nats"]
