"""The run folder: where the event store, the embedded NATS store and `server.json` live.

Default `./.kfactory`, or `$KF_HOME`, or `--home`. `server.json` names the NATS URL of
the server that owns the store right now, so other commands on this host find it.

A run folder holds `events.duckdb`; under `nats/`, the embedded nats-server's store, its
configuration and the port it keeps (`nats/port`); under `creds/`, every user's seed;
under `swarm/`, the state and logs of `kfactory up`; and `server.json` (URL, pid of the
live owner, store, and the CA its clients trust). `sql`, `events`, `ps`, `run` and
`actor` find the hub through it and connect as their user: the URL is `--nats`, else
`$KF_NATS_URL`, else `server.json`'s; credentials `--creds`, else `$KF_CREDS`, else the
run folder's seed; the CA `--tls-ca`, else `$KF_TLS_CA`, else `server.json`'s. A process
on another host gets its seed from `kfactory creds USER -o FILE` and passes it with
`--creds`, with the hub's CA as `--tls-ca`.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from bus.auth import AuthError, ClientAuth
from bus.server import pid_alive
from gpu_workers.atomic_file import write_atomically
from ops.accounts import client_auth

DEFAULT_HOME = Path(".kfactory")


class ServerInfo(msgspec.Struct, frozen=True):
    url: str
    pid: int
    store: str
    ca: str | None = None
    """The CA that signed the server's TLS certificate, for clients on this host."""


def resolve_home(home: Path | None) -> Path:
    return Path(home or os.environ.get("KF_HOME") or DEFAULT_HOME)


def store_path(home: Path) -> Path:
    return home / "events.duckdb"


def server_file(home: Path) -> Path:
    return home / "server.json"


def write_server_info(home: Path, info: ServerInfo) -> None:
    write_atomically(server_file(home), msgspec.json.encode(info))


def clear_server_info(home: Path, pid: int) -> None:
    info = running_server(home)
    if info is not None and info.pid == pid:
        server_file(home).unlink(missing_ok=True)


def running_server(home: Path) -> ServerInfo | None:
    """The server that owns this home's store, if one is alive."""
    try:
        info = msgspec.json.decode(server_file(home).read_bytes(), type=ServerInfo)
    except (OSError, msgspec.DecodeError):
        return None
    return info if pid_alive(info.pid) else None


def nats_url(explicit: str | None, home: Path) -> str | None:
    """--nats, else $KF_NATS_URL, else the URL of this home's running server."""
    if explicit:
        return explicit
    if os.environ.get("KF_NATS_URL"):
        return os.environ["KF_NATS_URL"]
    info = running_server(home)
    return info.url if info else None


def client_auth_for(
    home: Path, user: str, creds: Path | None = None, ca: Path | None = None
) -> ClientAuth:
    """--creds, else $KF_CREDS, else the run folder's seed for `user`; --tls-ca, else
    $KF_TLS_CA, else the CA of this home's running server."""
    creds = creds or (Path(os.environ["KF_CREDS"]) if os.environ.get("KF_CREDS") else None)
    if ca is None and os.environ.get("KF_TLS_CA"):
        ca = Path(os.environ["KF_TLS_CA"])
    if ca is None:
        info = running_server(home)
        ca = Path(info.ca) if info is not None and info.ca else None
    if creds is not None:
        if not creds.exists():
            raise AuthError(f"no credentials file {creds}")
        return ClientAuth(creds, ca)
    return client_auth(home, user, ca)
