"""Events that record messages which could not be handled. Their ids are derived from
the message itself, so reporting the same failure twice stores it once.

- `EventRejected` (the recorder): a message on `kf.ev.>` that is not a valid event, with
  the reason, its subject and stream sequence, and the first `RAW_EXCERPT_BYTES` (2 KiB)
  of its bytes; its id derives from the sequence and a digest of the bytes.
- `DeadLettered`: a message a consumer gave up on, with the consumer, the deliveries, the
  reason and the original event's id; its id derives from the consumer and the stream
  sequence, so the actor that gave up and the recorder that saw the server's
  max-deliveries advisory report it once.

The campaign is the subject's if it is a safe campaign id, else `kf-system`. Both are
published through the bus and stored like any event.
"""

from __future__ import annotations

import hashlib

from bus.subjects import is_campaign_id, parse_event_subject
from eventstore.codec import InvalidEvent, decode
from eventstore.events import SYSTEM_CAMPAIGN, ActorRef, DeadLettered, EventRejected, new_event
from eventstore.ids import stable_event_id

RAW_EXCERPT_BYTES = 2048


def _campaign_of(subject: str) -> str:
    parsed = parse_event_subject(subject)
    if parsed is None or not is_campaign_id(parsed[0]):
        return SYSTEM_CAMPAIGN
    return parsed[0]


def rejection_event(
    actor: ActorRef, subject: str, data: bytes, stream_seq: int, published_ms: int, reason: str
) -> EventRejected:
    """A message on `kf.ev.>` that is not a valid event."""
    digest = hashlib.sha256(data).hexdigest()
    return new_event(
        EventRejected,
        event_id=stable_event_id(published_ms, "rejected", stream_seq, digest),
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
    published_ms: int,
    deliveries: int,
    reason: str,
) -> DeadLettered:
    """A message `consumer` gave up on; one per (consumer, message), whoever reports it."""
    try:
        original_id: str | None = decode(data).event_id
    except InvalidEvent:
        original_id = None
    return new_event(
        DeadLettered,
        event_id=stable_event_id(published_ms, "dead", consumer, stream_seq),
        campaign_id=_campaign_of(subject),
        actor=actor,
        consumer=consumer,
        subject=subject,
        stream_seq=stream_seq,
        deliveries=deliveries,
        reason=reason,
        original_event_id=original_id,
    )
