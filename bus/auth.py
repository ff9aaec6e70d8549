"""Who may connect to the bus and what each user may do there.

Users authenticate with NATS nkeys: a seed file (mode 0600) on the client, its public
key in the server's configuration with the user's subject permissions. The bus knows
no roles: callers name users and give their permissions (see `ops/accounts.py`).

Seeds are written with `write_private`: the file 0600, its folder 0700. Each user's
replies arrive under `_INBOX.<its public key>` (`inbox_prefix`, set as the client's inbox
prefix), an inbox no other user may subscribe to. `authorization` turns public key ->
`Permissions` into a configuration's `authorization` block (the embedded hub's, and each
node's of a cluster through `ops/deploy/render.py`); `server_config` adds `tls`, with
which clients must use TLS and verify the server with the CA of `ClientAuth.ca_file`. A
client without credentials, or with unknown ones, is refused at connection
(`bus/connection.py` raises AuthError); a refused publish or subscription is logged by
the server. `is_loopback` is what lets a hub run without authentication (loopback only).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import nkeys

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
#: What a user's event-id key is derived for, so that the key serves nothing else.
EVENT_ID_LABEL = b"kfactory/derived-event-ids/v1"


class AuthError(RuntimeError):
    """Credentials that cannot be read, or a configuration that is unsafe."""


@dataclass(frozen=True)
class Permissions:
    """Subjects a user may publish to and subscribe to (NATS wildcards allowed)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_subscribe: tuple[str, ...] = ()
    deny_publish: tuple[str, ...] = ()
    allow_responses: bool = False
    """May reply to requests it received (services), whatever their reply subject."""


@dataclass(frozen=True)
class TlsFiles:
    """The server's certificate and key (clients verify it with the CA that signed it)."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class ClientAuth:
    """How a client proves who it is, and whom it trusts (the hub's CA)."""

    seed_file: Path | None = None
    ca_file: Path | None = None

    @property
    def inbox_prefix(self) -> str:
        """Each user's replies arrive under an inbox only that user may subscribe to."""
        return inbox_prefix(public_key(self.seed_file)) if self.seed_file else "_INBOX"

    def tls_context(self) -> ssl.SSLContext | None:
        if self.ca_file is None:
            return None
        return ssl.create_default_context(cafile=str(self.ca_file))


def inbox_prefix(public: str) -> str:
    return f"_INBOX.{public}"


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner can read (created with mode 0600, never wider). A
    folder it has to create is made 0700; an existing one is left as it is."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=PRIVATE_DIR)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def create_seed_file(path: Path) -> str:
    """Create a user nkey seed at `path` (mode 0600); returns its public key."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    write_private(path, bytes(seed) + b"\n")
    return public_key(path)


def public_key(seed_file: Path) -> str:
    pair = _key_pair(seed_file)
    key = pair.public_key
    pair.wipe()
    return key.decode() if isinstance(key, bytes) else str(key)


def _key_pair(seed_file: Path) -> nkeys.KeyPair:
    try:
        return nkeys.from_seed(bytearray(Path(seed_file).read_bytes().strip()))
    except (OSError, nkeys.NkeysError) as exc:
        raise AuthError(f"{seed_file} is not a readable NATS nkey seed file: {exc}") from exc


def event_id_key(seed_file: Path | None) -> bytes:
    """The secret a user's processes key their derived event ids with
    (`eventstore/ids.py`): HMAC-SHA256 of `EVENT_ID_LABEL` under the user's nkey seed.
    Every holder of the seed file (every instance of one role) derives the same key, and
    no other user can. Empty without a seed file: a bus without users has no one to keep
    out."""
    if seed_file is None:
        return b""
    pair = _key_pair(seed_file)
    try:
        return hmac.new(bytes(pair.seed), EVENT_ID_LABEL, hashlib.sha256).digest()
    finally:
        pair.wipe()


def authorization(users: dict[str, Permissions]) -> dict[str, object]:
    """The `authorization` block of a nats-server configuration for these nkey users
    (public key -> permissions)."""
    entries = []
    for key, perms in users.items():
        permissions: dict[str, object] = {
            "publish": {"allow": list(perms.publish), "deny": list(perms.deny_publish)},
            "subscribe": {"allow": list(perms.subscribe), "deny": list(perms.deny_subscribe)},
        }
        if perms.allow_responses:
            permissions["allow_responses"] = True
        entries.append({"nkey": key, "permissions": permissions})
    return {"users": entries, "timeout": 5}


def server_config(users: dict[str, Permissions], tls: TlsFiles | None = None) -> str:
    """A nats-server configuration (JSON is valid NATS config) for these nkey users.

    `users` maps public keys to permissions. With `tls`, clients must use TLS.
    """
    config: dict[str, object] = {}  # JetStream and its store come from the command line
    if users:
        config["authorization"] = authorization(users)
    if tls is not None:
        config["tls"] = {"cert_file": str(tls.cert), "key_file": str(tls.key), "timeout": 5}
    return json.dumps(config, indent=2)


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")
