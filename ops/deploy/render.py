"""Render a cluster description (`cluster.toml`) into nats-server configurations.

Every node gets the same users as the embedded hub: the run folder's nkeys with the
permissions of `ops/accounts.py`. Clients, routes and leaf connections use TLS; the
nodes verify each other's route certificates with the CA. Each GPU host's leaf node
gets its own nkey (`creds/leaf-NAME.nk`), allowed on the cluster what the roles it
carries are allowed, and serves those roles' users on its loopback.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jinja2
import msgspec

from bus.auth import Permissions, authorization, create_seed_file, public_key, write_private
from ops.accounts import USERS, creds_dir, ensure_credentials, permissions, seed_path

CLIENT_PORT = 4222
ROUTE_PORT = 6222
LEAF_PORT = 7422
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
    leaf_port: int = LEAF_PORT


class Leaf(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    roles: list[str]
    listen: str = "127.0.0.1"
    port: int = CLIENT_PORT


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
    leaf: list[Leaf] = []

    def client_urls(self) -> str:
        """The URL list clients join the cluster with (comma-separated, `--nats`)."""
        return ",".join(f"nats://{n.host}:{n.client_port}" for n in self.node)


def load(path: Path) -> Deployment:
    try:
        data = tomllib.loads(Path(path).read_text())
        deployment = msgspec.convert(data, type=Deployment)
    except (OSError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise DeployError(f"{path}: {exc}") from exc
    names = [n.name for n in deployment.node]
    if len(names) < 3 or len(set(names)) != len(names):
        raise DeployError(f"{path}: a cluster needs at least 3 nodes with distinct names")
    for leaf in deployment.leaf:
        unknown = sorted(set(leaf.roles) - set(USERS))
        if unknown:
            raise DeployError(f"{path}: leaf {leaf.name} names unknown users {unknown}")
    return deployment


def _templates() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # nats-server configuration, not HTML
    )


def leaf_seed(home: Path, leaf: Leaf) -> Path:
    return creds_dir(home) / f"leaf-{leaf.name}.nk"


def _union(granted: list[Permissions]) -> Permissions:
    def merged(lists: list[tuple[str, ...]]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s for subjects in lists for s in subjects))

    return Permissions(
        merged([p.publish for p in granted]),
        merged([p.subscribe for p in granted]),
        merged([p.deny_subscribe for p in granted]),
        any(p.allow_responses for p in granted),
    )


def render(deployment: Deployment, home: Path) -> dict[str, str]:
    """File name -> text: `NODE.conf` per node, `leaf-NAME.conf` per leaf node.

    Creates the run folder's credentials (and each leaf's seed) where missing."""
    ensure_credentials(home)
    granted = permissions(home)
    by_user = {user: granted[public_key(seed_path(home, user))] for user in USERS}
    users = dict(granted)
    for leaf in deployment.leaf:
        seed = leaf_seed(home, leaf)
        key = public_key(seed) if seed.exists() else create_seed_file(seed)
        users[key] = _union([by_user[role] for role in leaf.roles])
    templates = _templates()
    rendered: dict[str, str] = {}
    for node in deployment.node:
        rendered[f"{node.name}.conf"] = templates.get_template("nats-node.conf.j2").render(
            cluster=deployment.cluster,
            node=node,
            peers=[n for n in deployment.node if n is not node],
            tls=deployment.tls.for_node(node.name),
            authorization=json.dumps(authorization(users), indent=2),
        )
    for leaf in deployment.leaf:
        local = {public_key(seed_path(home, role)): by_user[role] for role in leaf.roles}
        rendered[f"leaf-{leaf.name}.conf"] = templates.get_template("nats-leaf.conf.j2").render(
            leaf=leaf,
            nodes=deployment.node,
            tls=deployment.tls,
            seed=leaf_seed(home, leaf).read_text().strip(),
            authorization=json.dumps(authorization(local), indent=2),
        )
    return rendered


def write(rendered: dict[str, str], out: Path) -> list[Path]:
    """Write the files, each private (a leaf's holds its seed; a node's, every user's
    permissions)."""
    written = []
    for name, text in rendered.items():
        path = out / name
        write_private(path, text.encode())
        written.append(path)
    return written
