"""Render a cluster description (`cluster.toml`) into nats-server configurations.

Every node gets the same users as the embedded hub: the run folder's nkeys with the
permissions of `ops/accounts.py`. Clients and routes use TLS; the nodes verify each
other's route certificates with the CA. The cluster's JetStream has a domain, and each
node accepts leaf nodes (TLS): a GPU host runs one, without JetStream, for its actors.

A leaf connects as one user (`leaf-NAME`, its seed inside the leaf's file): on the
cluster it may do what all the roles of that host may do together. Each role's own
permissions are enforced by the leaf itself, which has the roles' users.

- `sync_interval` is the description's (shipped `always`: every write fsynced before it
  is acknowledged; the 2-minute default lost acknowledged writes in Jepsen's analysis of
  NATS 2.12.1). The `authorization` block is `bus/auth.authorization` over
  `ops/accounts.permissions`, the table the embedded hub's configuration comes from.
- A leaf's clients reach JetStream through the cluster's `domain`, so every user gets
  both forms of its JetStream and KV subjects (`in_domain`: `$JS.API.X` becomes
  `$JS.<domain>.API.X`, `$KV.X` becomes `$JS.<domain>.API.$KV.X`); the leaf's own users
  get the domain form only.
- A leaf user may publish events and heartbeats as families (`kf.ev.>`, `kf.hb.>`), less
  every event type and heartbeat subject none of its roles publishes
  (`leaf_user_permissions`): nats-server announces a stream's `kf.ev.>` interest to a
  leaf only if its user may publish the whole of it. Leaf users are in the top-level
  `authorization`; nats-server's `leafnodes` authorization takes no nkeys or permissions.
- `render` creates the run folder's seeds where missing (and each leaf's); `write` writes
  the files 0600. `on_this_host` moves a description onto 127.0.0.1 ports for tests and
  benches.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple, cast

import jinja2
import msgspec

from bus.auth import (
    Permissions,
    authorization,
    create_seed_file,
    is_loopback,
    public_key,
    write_private,
)
from bus.heartbeat import HEARTBEAT_PREFIX, PING, role_subjects
from bus.subjects import EVENTS_PREFIX
from eventstore.authority import ACTOR_ROLES
from eventstore.events import EVENT_TYPES
from ops.accounts import creds_dir, ensure_credentials, permissions, seed_path

CLIENT_PORT = 4222
ROUTE_PORT = 6222
LEAF_PORT = 7422
#: What a GPU host runs: its leaf's user may do what these roles may do.
GPU_ROLES = ("verifier", "benchmarker")
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
    """A GPU host's leaf node: its actors connect to it, it connects to the cluster."""

    name: str
    roles: list[str] = msgspec.field(default_factory=lambda: list(GPU_ROLES))
    listen: str = "127.0.0.1"
    client_port: int = CLIENT_PORT


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
    #: The JetStream domain; clients of a leaf node set KF_JS_DOMAIN to it.
    domain: str = "kfactory"


class Deployment(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    cluster: Cluster
    tls: Tls
    node: list[Node]
    leaf: list[Leaf] = msgspec.field(default_factory=list)

    def client_urls(self) -> str:
        """The URL list clients join the cluster with (comma-separated, `--nats`)."""
        return ",".join(f"nats://{n.host}:{n.client_port}" for n in self.node)


def ports_needed(deployment: Deployment) -> int:
    return 3 * len(deployment.node) + len(deployment.leaf)


def on_this_host(deployment: Deployment, base: Path, tls: Tls, ports: list[int]) -> Deployment:
    """The same cluster with every node on 127.0.0.1 (tests, benches): its own store
    under `base`, three of `ports` each (client, route, leaf) and one per leaf node,
    `tls` for all."""
    if len(ports) < ports_needed(deployment):
        raise DeployError(f"this deployment needs {ports_needed(deployment)} ports")
    free = iter(ports)
    nodes = [
        msgspec.structs.replace(
            node,
            host="127.0.0.1",
            listen="127.0.0.1",
            store_dir=str(base / node.name),
            client_port=next(free),
            route_port=next(free),
            leaf_port=next(free),
        )
        for node in deployment.node
    ]
    leaves = [msgspec.structs.replace(leaf, client_port=next(free)) for leaf in deployment.leaf]
    return msgspec.structs.replace(deployment, tls=tls, node=nodes, leaf=leaves)


def load(path: Path) -> Deployment:
    try:
        data = tomllib.loads(Path(path).read_text())
        deployment = msgspec.convert(data, type=Deployment)
    except (OSError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise DeployError(f"{path}: {exc}") from exc
    names = [n.name for n in deployment.node]
    if len(names) < 3 or len(set(names)) != len(names):
        raise DeployError(f"{path}: a cluster needs at least 3 nodes with distinct names")
    leaves = [leaf.name for leaf in deployment.leaf]
    if len(set(leaves)) != len(leaves) or set(leaves) & set(names):
        raise DeployError(f"{path}: leaf nodes need distinct names, unlike the nodes'")
    for leaf in deployment.leaf:
        unknown = sorted(set(leaf.roles) - set(ACTOR_ROLES))
        if unknown or not leaf.roles:
            raise DeployError(
                f"{path}: leaf {leaf.name}: roles are some of {', '.join(ACTOR_ROLES)}"
                + (f", not {', '.join(unknown)}" if unknown else "")
            )
        if not is_loopback(leaf.listen):  # its clients are its own host's actors, no TLS
            raise DeployError(
                f"{path}: leaf {leaf.name} must listen on 127.0.0.1, not {leaf.listen}"
            )
    return deployment


def _templates() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # nats-server configuration, not HTML
    )


def in_domain(subject: str, domain: str) -> str:
    """The subject a client in JetStream `domain` publishes for `subject`."""
    if subject.startswith("$JS.API."):
        return f"$JS.{domain}.API.{subject.removeprefix('$JS.API.')}"
    if subject.startswith("$KV."):  # bus/lease.py writes KV keys through the domain
        return f"$JS.{domain}.API.{subject}"
    return subject


def _domained(perms: Permissions, domain: str, keep_plain: bool) -> Permissions:
    """`perms` for a client in `domain` (and, with `keep_plain`, for one outside it)."""
    publish = [in_domain(s, domain) for s in perms.publish]
    if keep_plain:
        publish = [*perms.publish, *(s for s in publish if s not in perms.publish)]
    return replace(perms, publish=tuple(publish))


class LeafUser(NamedTuple):
    allowed: Permissions
    deny_publish: tuple[str, ...]


def leaf_user_permissions(roles: list[str], role_permissions: list[Permissions]) -> LeafUser:
    """What a leaf's connection may do on the cluster: what its roles may do together.

    nats-server (2.15) tells a leaf of interest that appears after it joined only in a
    subject its user may publish as a whole: a stream on `kf.ev.>` (or a `kf.hb.*.*`
    heartbeat watcher) is not announced to a leaf whose user may publish
    `kf.ev.*.KernelVerified` only, and its events find no stream. So events and
    heartbeats are allowed as a family, less every member none of the roles may publish."""
    publish: list[str] = []
    emitted: set[str] = set()
    for perms in role_permissions:
        for subject in perms.publish:
            tokens = subject.split(".")
            if subject.startswith(f"{EVENTS_PREFIX}."):
                emitted.add(tokens[3])
            elif subject.startswith(f"{HEARTBEAT_PREFIX}."):
                continue
            elif subject not in publish:
                publish.append(subject)
    denied = [t for t in sorted(EVENT_TYPES) if t not in emitted]
    deny_publish = [
        *(s for t in denied for s in (f"{EVENTS_PREFIX}.*.{t}", f"{EVENTS_PREFIX}.*.{t}.*")),
        PING,
        *(role_subjects(r) for r in ACTOR_ROLES if r not in roles),
    ]
    subscribe: list[str] = []
    for perms in role_permissions:
        subscribe += [s for s in perms.subscribe if s not in subscribe]
    allowed = Permissions(
        (f"{EVENTS_PREFIX}.>", f"{HEARTBEAT_PREFIX}.>", *publish),
        tuple(subscribe),
        allow_responses=any(p.allow_responses for p in role_permissions),
    )
    return LeafUser(allowed, tuple(deny_publish))


def _authorization(users: dict[str, Permissions], leaves: dict[str, LeafUser]) -> str:
    """The `authorization` block: `users`, and each leaf user with its publish denials."""
    block = authorization({**users, **{key: leaf.allowed for key, leaf in leaves.items()}})
    for entry in cast(list[dict[str, Any]], block["users"]):
        if entry["nkey"] in leaves:
            entry["permissions"]["publish"]["deny"] = list(leaves[entry["nkey"]].deny_publish)
    return json.dumps(block, indent=2)


def leaf_seed(home: Path, leaf: Leaf) -> Path:
    """The seed a leaf node connects to the cluster with (created where missing)."""
    path = creds_dir(home) / f"leaf-{leaf.name}.nk"
    if not path.exists():
        create_seed_file(path)
    return path


def render(deployment: Deployment, home: Path) -> dict[str, str]:
    """File name -> text: `NODE.conf` per node, `leaf-NAME.conf` per leaf node.

    Creates the run folder's credentials where missing (and each leaf's seed)."""
    ensure_credentials(home)
    domain = deployment.cluster.domain
    plain = permissions(home)
    granted = {key: _domained(perms, domain, keep_plain=True) for key, perms in plain.items()}
    role_keys = {role: public_key(seed_path(home, role)) for role in ACTOR_ROLES}
    leaf_users = {
        public_key(leaf_seed(home, leaf)): leaf_user_permissions(
            leaf.roles,
            [_domained(plain[role_keys[r]], domain, keep_plain=False) for r in leaf.roles],
        )
        for leaf in deployment.leaf
    }
    users = _authorization(granted, leaf_users)
    templates = _templates()
    node_template = templates.get_template("nats-node.conf.j2")
    rendered = {
        f"{node.name}.conf": node_template.render(
            cluster=deployment.cluster,
            node=node,
            peers=[n for n in deployment.node if n is not node],
            tls=deployment.tls.for_node(node.name),
            authorization=users,
        )
        for node in deployment.node
    }
    leaf_template = templates.get_template("nats-leaf.conf.j2")
    for leaf in deployment.leaf:
        local = {
            role_keys[r]: _domained(plain[role_keys[r]], domain, keep_plain=False)
            for r in leaf.roles
        }
        rendered[f"leaf-{leaf.name}.conf"] = leaf_template.render(
            cluster=deployment.cluster,
            leaf=leaf,
            hubs=[f"tls://{n.host}:{n.leaf_port}" for n in deployment.node],
            seed=leaf_seed(home, leaf).read_text().strip(),
            tls=deployment.tls,
            authorization=json.dumps(authorization(local), indent=2),
        )
    return rendered


def write(rendered: dict[str, str], out: Path) -> list[Path]:
    """Write the files, private (they list every user and what each may do)."""
    written = []
    for name, text in rendered.items():
        path = out / name
        write_private(path, text.encode())
        written.append(path)
    return written
