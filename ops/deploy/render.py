"""Render a cluster description (`cluster.toml`) into nats-server configurations.

Every node gets the same users as the embedded hub: the run folder's nkeys with the
permissions of `ops/accounts.py`. Clients and routes use TLS; the nodes verify each
other's route certificates with the CA.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jinja2
import msgspec

from bus.auth import authorization, write_private
from ops.accounts import ensure_credentials, permissions

CLIENT_PORT = 4222
ROUTE_PORT = 6222
SHIPPED = Path(__file__).parent / "cluster.toml"


class DeployError(ValueError):
    """A cluster description that cannot be rendered."""


class Node(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    host: str
    store_dir: str
    listen: str = "0.0.0.0"
    client_port: int = CLIENT_PORT
    route_port: int = ROUTE_PORT


class Tls(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    ca: str
    cert: str
    key: str

    def for_node(self, node: str) -> dict[str, str]:
        return {
            "ca": self.ca,
            "cert": self.cert.replace("{node}", node),
            "key": self.key.replace("{node}", node),
        }


class Cluster(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    sync_interval: str = "always"


class Deployment(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    cluster: Cluster
    tls: Tls
    node: list[Node]

    def client_urls(self) -> str:
        """The URL list clients join the cluster with (comma-separated, `--nats`)."""
        return ",".join(f"nats://{n.host}:{n.client_port}" for n in self.node)


def on_this_host(deployment: Deployment, base: Path, tls: Tls, ports: list[int]) -> Deployment:
    """The same cluster with every node on 127.0.0.1 (tests, benches): its own store
    under `base`, two of `ports` each (client, route), `tls` for all."""
    if len(ports) < 2 * len(deployment.node):
        raise DeployError(f"{len(deployment.node)} nodes need {2 * len(deployment.node)} ports")
    free = iter(ports)
    nodes = [
        msgspec.structs.replace(
            node,
            host="127.0.0.1",
            listen="127.0.0.1",
            store_dir=str(base / node.name),
            client_port=next(free),
            route_port=next(free),
        )
        for node in deployment.node
    ]
    return msgspec.structs.replace(deployment, tls=tls, node=nodes)


def load(path: Path) -> Deployment:
    try:
        data = tomllib.loads(Path(path).read_text())
        deployment = msgspec.convert(data, type=Deployment)
    except (OSError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise DeployError(f"{path}: {exc}") from exc
    names = [n.name for n in deployment.node]
    if len(names) < 3 or len(set(names)) != len(names):
        raise DeployError(f"{path}: a cluster needs at least 3 nodes with distinct names")
    return deployment


def _templates() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # nats-server configuration, not HTML
    )


def render(deployment: Deployment, home: Path) -> dict[str, str]:
    """File name -> text: `NODE.conf` per node.

    Creates the run folder's credentials where missing."""
    ensure_credentials(home)
    users = json.dumps(authorization(permissions(home)), indent=2)
    template = _templates().get_template("nats-node.conf.j2")
    return {
        f"{node.name}.conf": template.render(
            cluster=deployment.cluster,
            node=node,
            peers=[n for n in deployment.node if n is not node],
            tls=deployment.tls.for_node(node.name),
            authorization=users,
        )
        for node in deployment.node
    }


def write(rendered: dict[str, str], out: Path) -> list[Path]:
    """Write the files, private (they list every user and what each may do)."""
    written = []
    for name, text in rendered.items():
        path = out / name
        write_private(path, text.encode())
        written.append(path)
    return written
