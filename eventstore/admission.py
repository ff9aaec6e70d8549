"""What the recorder accepts: one message in, an event and its canonical bytes out.

`admit` raises only `InvalidEvent`, whatever it is given, so no message can stop the
recorder: every refusal becomes an `EventRejected`. An accepted event is re-encoded
canonically; those bytes are what the store keeps, returns and hashes.

The checks, in order: the bytes decode (`codec.decode`: over `events.MAX_EVENT_BYTES`,
512 KiB, or nested deeper than `codec.MAX_DEPTH`, 32, is refused before parsing); the
subject is the event's own `kf.ev.<campaign>.<type>[.<target>]`; `Nats-Msg-Id` is its
`event_id`; its `actor.role` may emit its type (`authority.py`). A property-based test
throws arbitrary bytes and JSON at it (`tests/test_recorder_hostile.py`).
"""

from __future__ import annotations

from typing import NamedTuple

from bus.subjects import EVENTS_PREFIX
from eventstore.authority import emitters
from eventstore.codec import InvalidEvent, decode, encode
from eventstore.events import Event


class Admitted(NamedTuple):
    event: Event
    payload: bytes
    """The canonical bytes: stored, returned and hashed into the chain."""


def expected_subject(event: Event) -> str:
    target = event.subject_target
    subject = f"{EVENTS_PREFIX}.{event.campaign_id}.{event.type}"
    return f"{subject}.{target}" if target else subject


def admit(
    subject: str, data: bytes, msg_id: str | None = None, check_role: bool = True
) -> Admitted:
    """Decode and check one message; InvalidEvent (only) says why it is refused."""
    try:
        return _admit(subject, data, msg_id, check_role)
    except InvalidEvent:
        raise
    except Exception as exc:  # a bug here must not stop the recorder either
        raise InvalidEvent(f"could not be checked: {type(exc).__name__}: {exc}") from exc


def _admit(subject: str, data: bytes, msg_id: str | None, check_role: bool) -> Admitted:
    event = decode(data)
    if subject != expected_subject(event):
        raise InvalidEvent(
            f"subject {subject!r} does not match the event "
            f"(campaign {event.campaign_id!r}, type {event.type!r})"
        )
    if msg_id is not None and msg_id != event.event_id:
        raise InvalidEvent(f"Nats-Msg-Id {msg_id!r} differs from event_id {event.event_id!r}")
    if check_role and event.actor.role not in emitters(event.type):
        raise InvalidEvent(
            f"role {event.actor.role!r} may not emit {event.type} "
            f"(only {', '.join(sorted(emitters(event.type)))})"
        )
    return Admitted(event, encode(event))
