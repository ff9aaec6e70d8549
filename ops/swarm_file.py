"""`swarm.toml`: which actor processes `kfactory up` runs on this host, and where they join.

`[[actor]]` tables give a `role`, a `count` (0 to 64 processes) and a `target` the role
serves (default cpu); `nats` the URL(s) to join (none: `up` starts the hub here), `creds`
a folder of `ROLE.nk` seeds (none: the run folder's own) and `tls_ca` the hub's CA. A
wrong field, role or target is refused in one line (`SwarmFileError`). The shipped
example is `ops/deploy/swarm.toml`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec


class SwarmFileError(ValueError):
    """A swarm file that cannot be run, said in one line."""


class ActorGroup(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    role: str
    count: int = 1
    target: str = "cpu"


class SwarmFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    actor: list[ActorGroup]
    nats: str | None = None
    """NATS URL(s) to join, comma-separated; None: start the hub here."""
    creds: str | None = None
    """A folder of ROLE.nk seeds (None: the run folder's own credentials)."""
    tls_ca: str | None = None


def load_swarm(path: Path) -> SwarmFile:
    from actors.roles.registry import ROLES  # the role table imports every actor: only when loading

    try:
        swarm = msgspec.convert(tomllib.loads(Path(path).read_text()), type=SwarmFile)
    except (OSError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise SwarmFileError(f"{path}: {exc}") from exc
    if not swarm.actor:
        raise SwarmFileError(f"{path}: no [[actor]] to run")
    for group in swarm.actor:
        role = ROLES.get(group.role)
        if role is None:
            raise SwarmFileError(f"{path}: unknown role {group.role!r}; one of {', '.join(ROLES)}")
        if role.targets is not None and group.target not in role.targets:
            raise SwarmFileError(
                f"{path}: the {group.role} serves {', '.join(role.targets)}, not {group.target!r}"
            )
        if not 0 <= group.count <= 64:
            raise SwarmFileError(f"{path}: {group.role} count {group.count} is not in 0..64")
    for folder in (swarm.creds, swarm.tls_ca):
        if folder is not None and not Path(folder).exists():
            raise SwarmFileError(f"{path}: no such file or folder {folder}")
    return swarm
