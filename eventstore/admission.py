"""The one acceptance rule: what the recorder stores and what everyone downstream reads.

The recorder, every actor's decoding path (`actors/runtime.py`), `kfactory run`'s
follower (`ops/progress.py`) and the replay every projection rebuilds from
(`eventstore/queries.py`) all go through this module, so nothing downstream acts on a
message the recorder would refuse: `admit` for a message off the bus (subject, bytes,
`Nats-Msg-Id`), `acceptable` for an event read back from a store (`History.apply`).

`admit` raises only `InvalidEvent`, whatever it is given, so no message can stop the
recorder: every refusal becomes an `EventRejected`. An accepted event is re-encoded
canonically; those bytes are what the store keeps, returns and hashes.

The checks, in order: the bytes decode (`codec.decode`: over `events.MAX_EVENT_BYTES`,
512 KiB, or nested deeper than `codec.MAX_DEPTH`, 32, is refused before parsing); the
campaign id is a safe token (`bus.subjects.check_campaign_id`: letters, digits, `_`, `-`,
at most 64, so no dot can make one subject read as another); the subject is the
event's own `kf.ev.<campaign>.<type>[.<target>]`, so the role the bus let publish there
(its NATS permissions are per type) is one that may emit the type; `Nats-Msg-Id` is its
`event_id`; its `actor.role` may emit its type (`authority.py`). A property-based test
throws arbitrary bytes and JSON at it (`tests/test_recorder_hostile.py`).
"""

from __future__ import annotations

from typing import NamedTuple

from bus.subjects import EVENTS_PREFIX, SubjectError, check_campaign_id, is_campaign_id
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


def check_event(event: Event, check_role: bool = True) -> Event:
    """`event` if its campaign id is a safe token and its role may emit its type."""
    try:
        check_campaign_id(event.campaign_id)
    except SubjectError as exc:
        raise InvalidEvent(str(exc)) from exc
    if check_role and event.actor.role not in emitters(event.type):
        raise InvalidEvent(
            f"role {event.actor.role!r} may not emit {event.type} "
            f"(only {', '.join(sorted(emitters(event.type)))})"
        )
    return event


def acceptable(event: Event) -> bool:
    """Whether a stored event's campaign id is a safe token. A store written before that
    rule may hold an event whose dotted id forged another type's subject; projections
    skip those. (Stored events passed the role check already: the recorder has always
    made it, and tests build histories from hand-made events of any role.)"""
    return is_campaign_id(event.campaign_id)


def _admit(subject: str, data: bytes, msg_id: str | None, check_role: bool) -> Admitted:
    event = decode(data)
    check_event(event, check_role)
    if subject != expected_subject(event):
        raise InvalidEvent(
            f"subject {subject!r} does not match the event "
            f"(campaign {event.campaign_id!r}, type {event.type!r})"
        )
    if msg_id is not None and msg_id != event.event_id:
        raise InvalidEvent(f"Nats-Msg-Id {msg_id!r} differs from event_id {event.event_id!r}")
    return Admitted(event, encode(event))
