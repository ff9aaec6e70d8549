"""The bus users of a deployment and what each may do, and their credentials in the run folder.

One user per role (its actors publish only the event types the role emits and pull only
from the role's own consumers), `hub` (the recorder and the store's services), `cli`
(starts campaigns, follows them, asks the store) and `admin` (the only one that manages
streams). Seeds live in `<home>/creds/<user>.nk`, mode 0600 (the folder 0700), created
on the hub's first start; `kfactory creds USER -o FILE` copies one to another host.

`permissions` grants (public key -> `bus.auth.Permissions`):
- a role: publish the event types it emits (`eventstore/authority.py`, with its lifecycle
  and dead letters), `kf.svc.>` requests, heartbeats under its own role only
  (`kf.hb.<role>.*`); of the JetStream API, the stream's info and its own durable
  consumers (create, info, next, ack); subscribe to its own inbox
  (`_INBOX.<its public key>.>`) and `kf.hb.ping`. The librarian also answers its own
  service (`kf.svc.kf-librarian.>`). The benchmarker, the verifier and the kernel writer
  (the agent operator's tool runs) use the device leases (`KF_DEVICE_LEASES`), the
  verifier and the kernel writer only the shared leases' keys;
- `hub`: publish EventRejected and DeadLettered, ephemeral ordered consumers of the
  stream and its messages (for the dead-letter watcher), the recording lease
  (`KF_RECORDER_LEASE`) and, of `KF_DEVICE_LEASES`, only the stream info (to see that it
  exists); subscribe to `kf.svc.kf-store.>` (no other user does) and the
  max-deliveries advisories; reply to requests (`allow_responses`);
- `cli`: publish CampaignStarted, CampaignResumed and CampaignStalled, ordered consumers,
  store requests and `kf.hb.ping`; hear every heartbeat (`kf.hb.*.*`). The ordered
  consumers of `cli` and `hub` may be deleted by them, but never a role's durable work
  consumer (`deny_publish`): those are the admin's and their actors' alone;
- `admin`: everything except answering `kf.svc.>`; the hub uses it once, to create or
  update KF_EVENTS and the lease buckets. Actors and the recorder only wait for them.
No other user (but `admin`) may touch a lease bucket. The recorder checks the rest: an
event's `actor.role` must be an emitter of its type.
"""

from __future__ import annotations

import os
from pathlib import Path

from actors.runtime import durable_name
from bus.auth import (
    PRIVATE_DIR,
    AuthError,
    ClientAuth,
    Permissions,
    create_seed_file,
    inbox_prefix,
    public_key,
    write_private,
)
from bus.device_lease import SHARED_KEYS
from bus.heartbeat import HEARTBEAT_PREFIX, PING, role_subjects
from bus.lease import DEVICE_LEASES, RECORDER_LEASES, kv_stream, lease_subjects
from bus.subjects import EVENTS_PREFIX, SERVICE_PREFIX, STREAM
from eventstore.authority import ACTOR_ROLES, CLI, EMITS, RECORDER
from eventstore.queries import SERVICE as STORE_SERVICE

HUB = "hub"
ADMIN = "admin"
USERS = (*ACTOR_ROLES, HUB, CLI, ADMIN)

_API = "$JS.API"
_SERVICES_OF_ACTORS = {"librarian": "kf-librarian"}
#: The lease buckets each user may use (bus/lease.py), beyond what its role does.
_LEASES = {
    "benchmarker": (DEVICE_LEASES,),
    "verifier": (DEVICE_LEASES,),  # shares the device between timed windows
    "kernel-writer": (DEVICE_LEASES,),  # so do the agent operator's tool runs
    HUB: (RECORDER_LEASES,),
}
#: The lease keys a user may write, where not every key of its buckets.
_LEASE_KEYS = {"verifier": SHARED_KEYS, "kernel-writer": SHARED_KEYS}


def creds_dir(home: Path) -> Path:
    return home / "creds"


def seed_path(home: Path, user: str) -> Path:
    return creds_dir(home) / f"{user}.nk"


def ensure_credentials(home: Path) -> dict[str, Path]:
    """Every user's seed file, created (mode 0600) where missing."""
    found: dict[str, Path] = {}
    creds_dir(home).mkdir(parents=True, exist_ok=True)
    os.chmod(creds_dir(home), PRIVATE_DIR)
    for user in USERS:
        path = seed_path(home, user)
        if not path.exists():
            create_seed_file(path)
        found[user] = path
    return found


def known_askers(home: Path) -> dict[str, str]:
    """Each user's public key, to its name: who a request's reply inbox belongs to."""
    return {
        public_key(seed_path(home, user)): user for user in USERS if seed_path(home, user).exists()
    }


def client_auth(home: Path, user: str, ca_file: Path | None = None) -> ClientAuth:
    """The credentials this run folder holds for `user` (none when auth is off)."""
    path = seed_path(home, user)
    return ClientAuth(path if path.exists() else None, ca_file)


def export_seed(home: Path, user: str, out: Path | None) -> bytes:
    """Copy `user`'s seed to `out` (mode 0600), for a process on another host; with no
    `out`, only return it (`-o -`: the caller writes it to stdout)."""
    if user not in USERS:
        raise AuthError(f"unknown user {user!r}; one of {', '.join(USERS)}")
    source = seed_path(home, user)
    if not source.exists():
        raise AuthError(
            f"no credentials in {creds_dir(home)}: start `kfactory server` there once first"
        )
    seed = source.read_bytes()
    if out is not None:
        write_private(out, seed)
    return seed


def _events(types: tuple[str, ...]) -> list[str]:
    subjects: list[str] = []
    for event_type in types:
        subjects += [f"{EVENTS_PREFIX}.*.{event_type}", f"{EVENTS_PREFIX}.*.{event_type}.*"]
    return subjects


def _consumers(role: str) -> list[str]:
    from actors.roles.registry import (
        ROLES,  # the role implementations are heavy: only the hub needs them
    )

    targets = ROLES[role].targets
    return [durable_name(role, target) for target in (targets or (None,))]


def _actor(role: str, key: str) -> Permissions:
    publish = [
        *_events(EMITS[role]),
        f"{SERVICE_PREFIX}.>",
        f"{_API}.STREAM.INFO.{STREAM}",
        role_subjects(role),  # its own role's heartbeats, no other's
    ]
    for bucket in _LEASES.get(role, ()):
        publish += lease_subjects(bucket, _LEASE_KEYS.get(role, (">",)))
    for consumer in _consumers(role):
        publish += [
            f"{_API}.CONSUMER.DURABLE.CREATE.{STREAM}.{consumer}",
            f"{_API}.CONSUMER.INFO.{STREAM}.{consumer}",
            f"{_API}.CONSUMER.MSG.NEXT.{STREAM}.{consumer}",
            f"$JS.ACK.{STREAM}.{consumer}.>",
        ]
    subscribe = [f"{inbox_prefix(key)}.>", PING]
    service = _SERVICES_OF_ACTORS.get(role)
    if service is not None:  # the librarian answers its own questions
        subscribe += [f"{SERVICE_PREFIX}.{service}.>", "$SRV.>"]
    return Permissions(tuple(publish), tuple(subscribe), allow_responses=service is not None)


def _work_consumers() -> tuple[str, ...]:
    """Deleting any role's durable work consumer: no follower may (attack 5 of issue 34)."""
    return tuple(
        f"{_API}.CONSUMER.DELETE.{STREAM}.{consumer}"
        for role in ACTOR_ROLES
        for consumer in _consumers(role)
    )


def _follower(key: str, emits: tuple[str, ...], heartbeats: bool = False) -> Permissions:
    """Reads the whole stream with ephemeral ordered consumers (the recorder, the CLI);
    with `heartbeats`, also sees who is alive (`kfactory ps`, `kfactory run`)."""
    publish = [
        *_events(emits),
        f"{SERVICE_PREFIX}.>",
        f"{_API}.INFO",
        f"{_API}.STREAM.INFO.{STREAM}",
        f"{_API}.CONSUMER.CREATE.{STREAM}",
        f"{_API}.CONSUMER.DELETE.{STREAM}.*",
        f"{_API}.CONSUMER.INFO.{STREAM}.*",
        f"$JS.FC.{STREAM}.>",
    ]
    subscribe = [f"{inbox_prefix(key)}.>"]
    if heartbeats:
        publish.append(PING)
        subscribe.append(f"{HEARTBEAT_PREFIX}.*.*")
    return Permissions(tuple(publish), tuple(subscribe), deny_publish=_work_consumers())


def permissions(home: Path) -> dict[str, Permissions]:
    """Public key -> permissions, for every user whose seed is in the run folder."""
    granted: dict[str, Permissions] = {}
    for user in USERS:
        key = public_key(seed_path(home, user))
        if user in ACTOR_ROLES:
            granted[key] = _actor(user, key)
        elif user == CLI:
            granted[key] = _follower(key, EMITS[CLI], heartbeats=True)
        elif user == HUB:
            base = _follower(key, EMITS[RECORDER])
            granted[key] = Permissions(
                (
                    *base.publish,
                    f"{_API}.DIRECT.GET.{STREAM}",
                    f"{_API}.DIRECT.GET.{STREAM}.>",
                    f"{_API}.STREAM.MSG.GET.{STREAM}",
                    *(s for bucket in _LEASES[HUB] for s in lease_subjects(bucket)),
                    # a hub joining a cluster with these credentials sees the device
                    # bucket exists (bus/lease.py ensure_lease_bucket), and no more
                    f"{_API}.STREAM.INFO.{kv_stream(DEVICE_LEASES)}",
                ),
                (
                    *base.subscribe,
                    f"{SERVICE_PREFIX}.{STORE_SERVICE}.>",
                    "$SRV.>",
                    f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{STREAM}.*",
                ),
                deny_publish=base.deny_publish,
                allow_responses=True,
            )
        else:  # admin: everything, but it answers no service requests
            granted[key] = Permissions((">",), (">",), deny_subscribe=(f"{SERVICE_PREFIX}.>",))
    return granted
