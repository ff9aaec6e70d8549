"""Events that record messages which could not be handled. Their ids are derived from
the message itself under the reporter's key (`ids.py`: no other role can publish first
under one), so reporting the same failure twice stores it once.

- `EventRejected` (the recorder): a message on `kf.ev.>` that is not a valid event, with
  the reason, its subject and stream sequence, and the first `RAW_EXCERPT_BYTES` (2 KiB)
  of its bytes; its id derives from the sequence and a digest of the bytes.
- `DeadLettered`: a message a consumer gave up on, with the consumer, the deliveries (its
  count), the reason and the original event's id; its id derives from the consumer and
  the candidate the message is about (the event's own id for one about no candidate;
  one id for every unreadable message), never from the message's sequence or time. So
  however many messages of one candidate a consumer gives up on (forged copies, NAK'd
  deliveries, junk), and whichever instance of its role gives up, the store keeps one
  record per candidate: the others are duplicates of its id. A work consumer's messages
  are given up on only by its role's instances (the server's deliveries are unlimited,
  `bus/consumer.py`); the recorder reports, under the hub's key, a consumer with a
  server-side limit that the server's max-deliveries advisory names. Its time bits are
  0: no message's time is shared by all of them.

The campaign is the subject's if it is a safe campaign id, else `kf-system`. Both are
published through the bus and stored like any event.
"""

from __future__ import annotations

import hashlib

from bus.subjects import is_campaign_id, parse_event_subject
from eventstore.codec import InvalidEvent, decode
from eventstore.events import (
    SYSTEM_CAMPAIGN,
    ActorRef,
    DeadLettered,
    Event,
    EventRejected,
    new_event,
)
from eventstore.ids import stable_event_id

RAW_EXCERPT_BYTES = 2048


def _campaign_of(subject: str) -> str:
    parsed = parse_event_subject(subject)
    if parsed is None or not is_campaign_id(parsed[0]):
        return SYSTEM_CAMPAIGN
    return parsed[0]


def rejection_event(
    actor: ActorRef,
    subject: str,
    data: bytes,
    stream_seq: int,
    published_ms: int,
    reason: str,
    *,
    key: bytes,
) -> EventRejected:
    """A message on `kf.ev.>` that is not a valid event."""
    digest = hashlib.sha256(data).hexdigest()
    return new_event(
        EventRejected,
        event_id=stable_event_id(published_ms, "rejected", stream_seq, digest, key=key),
        campaign_id=_campaign_of(subject),
        actor=actor,
        subject=subject,
        stream_seq=stream_seq,
        reason=reason,
        raw_excerpt=data[:RAW_EXCERPT_BYTES].decode("utf-8", "replace"),
    )


def dead_letter_event(
    actor: ActorRef,
    consumer: str,
    subject: str,
    data: bytes,
    stream_seq: int,
    deliveries: int,
    reason: str,
    *,
    key: bytes,
) -> DeadLettered:
    """A message `consumer` gave up on; one per (consumer, candidate), whoever reports it
    and however many messages of that candidate it gave up on."""
    try:
        original: Event | None = decode(data)
    except InvalidEvent:
        original = None
    return new_event(
        DeadLettered,
        event_id=stable_event_id(0, "dead", consumer, *_given_up_on(original, subject), key=key),
        campaign_id=_campaign_of(subject),
        actor=actor,
        consumer=consumer,
        subject=subject,
        stream_seq=stream_seq,
        deliveries=deliveries,
        reason=reason,
        original_event_id=original.event_id if original is not None else None,
    )


def _given_up_on(original: Event | None, subject: str) -> tuple[str, ...]:
    """What a dead letter is one of: the candidate of its event (or the event itself, for
    one about no candidate); every unreadable message of a consumer is one thing."""
    if original is None:
        return ("unreadable",)
    candidate = getattr(original, "candidate_id", None)
    if isinstance(candidate, str):
        return ("candidate", _campaign_of(subject), candidate)
    return ("event", original.event_id)
