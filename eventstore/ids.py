"""Event ids: UUIDv7 (time-ordered), and ids derived deterministically from their cause.

A reaction's id is derived from (cause, role, ordinal): when a message is redelivered
and its handler runs twice, both runs emit the same ids, and the duplicates vanish in
JetStream's dedupe window and in the store.

A derived id is UUIDv7-shaped (`stable_event_id`): the cause's time in the time bits, a
hash of the parts in the rest. A fact that several causes can reach takes its id from
one event they share, so it is stored once: a generation's lessons, stall and close from
its GenerationOpened (`actors/roles/librarian.py`), a campaign's finish from its
CampaignStarted (`actors/roles/planner.py`), a failure from the message
(`failures.py`).
"""

from __future__ import annotations

import hashlib
import uuid

import uuid_utils


def new_event_id() -> str:
    return str(uuid_utils.uuid7())


def stable_event_id(unix_ms: int, *parts: str | int) -> str:
    """A UUIDv7-shaped id: `unix_ms` in the time bits, a hash of `parts` in the rest."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    raw = bytearray((unix_ms & (2**48 - 1)).to_bytes(6, "big") + digest[:10])
    raw[6] = 0x70 | (raw[6] & 0x0F)  # version 7
    raw[8] = 0x80 | (raw[8] & 0x3F)  # RFC 4122 variant
    return str(uuid.UUID(bytes=bytes(raw)))


def derived_event_id(cause_id: str, *parts: str | int) -> str:
    """The id of the `parts`-th reaction to `cause_id`, the same on every redelivery."""
    try:
        unix_ms = int.from_bytes(uuid.UUID(cause_id).bytes[:6], "big")
    except ValueError:
        unix_ms = 0
    return stable_event_id(unix_ms, cause_id, *parts)
