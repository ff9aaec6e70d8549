"""Event ids: UUIDv7 (time-ordered), and ids derived from their cause under a role's key.

A reaction's id is derived from (cause, role, ordinal): when a message is redelivered
and its handler runs twice, both runs emit the same ids, and the duplicates vanish in
JetStream's dedupe window and in the store.

The id is also the message's `Nats-Msg-Id`, which JetStream dedupes across the whole
stream, and the store keeps one event per id: whoever publishes an id first owns it. So
a derived id is keyed: HMAC-SHA256 under the deriving role's key of the cause and the
parts (`derived_event_id`). The key is `bus.auth.event_id_key` of the role's nkey seed
(through a fixed label), which every instance of the role holds and no other role does:
all instances (a survivor and a deposed instance's late answer alike) derive the same id
for the same cause, and another role, seeing the cause, cannot predict it. Without
credentials (a bus with no users: the embedded laptop swarm on loopback) the key is
empty and the id the plain SHA-256 of the parts, as before keys: there is no one to keep
out.

A derived id is UUIDv7-shaped (`stable_event_id`): the cause's time in the time bits, the
digest in the rest. A fact that several causes can reach takes its id from one event
they share, so it is stored once: a generation's lessons, stall and close from its
GenerationOpened (`actors/roles/librarian.py`), a campaign's finish from its
CampaignStarted (`actors/roles/planner.py`): each is one role's, under its key. A
failure (`failures.py`) is keyed by its reporter: the recorder's rejections by the hub's
key, a dead letter by the role whose instance gave up (a work consumer's messages are
given up on by its role's instances alone, `bus/consumer.py`).

Ids are never derived again from stored events (the audit and the replay read them as
recorded), so stores written before keys still read and audit.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid

import uuid_utils


def new_event_id() -> str:
    return str(uuid_utils.uuid7())


def stable_event_id(unix_ms: int, *parts: str | int, key: bytes = b"") -> str:
    """A UUIDv7-shaped id: `unix_ms` in the time bits, a digest of `parts` in the rest:
    HMAC-SHA256 under `key`, or plain SHA-256 without one."""
    joined = "|".join(map(str, parts)).encode()
    digest = (
        hmac.new(key, joined, hashlib.sha256).digest() if key else hashlib.sha256(joined).digest()
    )
    raw = bytearray((unix_ms & (2**48 - 1)).to_bytes(6, "big") + digest[:10])
    raw[6] = 0x70 | (raw[6] & 0x0F)  # version 7
    raw[8] = 0x80 | (raw[8] & 0x3F)  # RFC 4122 variant
    return str(uuid.UUID(bytes=bytes(raw)))


def derived_event_id(cause_id: str, *parts: str | int, key: bytes) -> str:
    """The id of the `parts`-th reaction to `cause_id` under the role's `key`, the same on
    every redelivery and for every instance of the role."""
    try:
        unix_ms = int.from_bytes(uuid.UUID(cause_id).bytes[:6], "big")
    except ValueError:
        unix_ms = 0
    return stable_event_id(unix_ms, cause_id, *parts, key=key)
