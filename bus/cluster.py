"""A JetStream cluster of nats-server children on this machine: the fault tests' and the
soak's stand-in for three hosts.

Every node is an `EmbeddedNatsServer` with its own store, a fixed route port and routes to
the others; a node can be killed (SIGKILL, nothing flushed) and started again on the same
ports and store, as a crashed host would come back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from bus.auth import ClientAuth
from bus.connection import connect, jetstream
from bus.server import EmbeddedNatsServer, NatsServerError

CLUSTER_NAME = "kf"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class LocalCluster:
    """`size` routed nats-servers with JetStream, named n1..nN, under `base_dir`."""

    def __init__(
        self,
        base_dir: Path,
        size: int = 3,
        config_file: Path | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        if size < 1:
            raise ValueError("a cluster has at least one node")
        route_ports = [free_port(host) for _ in range(size)]
        routes = ",".join(f"nats://{host}:{port}" for port in route_ports)
        self.nodes = []
        for i, route_port in enumerate(route_ports):
            clustering = [
                "--name", f"n{i + 1}",
                "--cluster_name", CLUSTER_NAME,
                "--cluster", f"nats://{host}:{route_port}",
                "--routes", routes,
            ]  # fmt: skip
            self.nodes.append(
                EmbeddedNatsServer(
                    Path(base_dir) / f"n{i + 1}",
                    host=host,
                    port=free_port(host),
                    config_file=config_file,
                    extra_args=clustering,
                )
            )

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated, as `connect` and `--nats` take them."""
        return ",".join(self.urls)

    def start(self, ready_timeout: float = 30.0) -> str:
        for node in self.nodes:
            node.start(ready_timeout)
        return self.url

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def kill(self, index: int) -> None:
        """SIGKILL node `index`: no flush, no goodbye to its routes."""
        node = self.nodes[index]
        if node.pid is None or not node.running:
            raise NatsServerError(f"node n{index + 1} is not running")
        os.kill(node.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while node.running and time.monotonic() < deadline:
            time.sleep(0.02)

    def restart(self, index: int) -> str:
        """Start node `index` again on its ports and store (after `kill` or on its own)."""
        return self.nodes[index].restart()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


async def wait_for_jetstream(
    urls: str | Sequence[str], timeout: float = 30.0, auth: ClientAuth | None = None
) -> None:
    """Return once the cluster's JetStream answers (it has elected a meta leader)."""
    url = urls if isinstance(urls, str) else ",".join(urls)
    nc = await connect(url, "cluster-probe", wait_for_server=timeout, auth=auth)
    try:
        js = jetstream(nc, timeout=2.0)
        deadline = time.monotonic() + timeout
        while True:
            try:
                await js.account_info()
                return
            except Exception as exc:  # no meta leader yet: "JetStream not enabled", timeouts
                if time.monotonic() > deadline:
                    raise TimeoutError(f"JetStream of {url} not ready: {exc}") from exc
                await asyncio.sleep(0.2)
    finally:
        await nc.close()
