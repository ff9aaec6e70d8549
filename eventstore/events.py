"""The event types: one msgspec tagged union of frozen structs, tagged by `type`.

Every event carries the envelope of `Event` (id, campaign, schema, actor, causation,
correlation, timestamp) and a payload of its own. Events are facts in the past tense:
never updated, never deleted. A schema change adds fields with defaults; anything
else bumps `SCHEMA` and registers an upcaster (see `codec.py`).
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from typing import Any, ClassVar, TypeVar

import msgspec

from eventstore.ids import new_event_id

#: Events larger than this are refused; big blobs must go to the blob store by hash.
MAX_EVENT_BYTES = 512 * 1024

#: The campaign id of facts that belong to no campaign (actor lifecycle, bad messages).
SYSTEM_CAMPAIGN = "kf-system"


class ActorRef(msgspec.Struct, frozen=True, gc=False):
    role: str
    instance: str
    host: str

    @classmethod
    def here(cls, role: str, instance: str | None = None) -> ActorRef:
        return cls(
            role=role, instance=instance or f"{role}-{os.getpid()}", host=socket.gethostname()
        )


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", gc=False):
    """The envelope shared by every event.

    Events are immutable trees without cycles, so the garbage collector need not track
    them (`gc=False`): replaying a million of them then costs no collector passes.
    """

    SCHEMA: ClassVar[int] = 1

    event_id: str
    campaign_id: str
    schema: int = 1
    actor: ActorRef
    causation_id: str | None = None
    correlation_id: str | None = None
    ts: datetime

    @property
    def type(self) -> str:
        return type(self).__name__

    @property
    def subject_target(self) -> str | None:
        """The subject suffix work consumers can filter on (a device target), if any."""
        return None


# --- campaign lifecycle -------------------------------------------------------------


class CampaignStarted(Event, tag=True, frozen=True):
    name: str
    problem: str
    target: str
    config: dict[str, Any] = {}


class CampaignFinished(Event, tag=True, frozen=True):
    reason: str
    summary: dict[str, Any] = {}


# --- devices and kernels --------------------------------------------------------------


class HostCalibrated(Event, tag=True, frozen=True):
    """Measured ceilings of one device, the denominators of every roofline fraction."""

    device: str
    bandwidth_gbs: float
    peak_gflops: float
    method: dict[str, Any] = {}


class KernelVerified(Event, tag=True, frozen=True):
    problem: str
    device: str
    source_hash: str
    max_rel_err: float
    trials: int
    evidence: dict[str, Any] = {}


class KernelRejected(Event, tag=True, frozen=True):
    problem: str
    device: str
    source_hash: str
    stage: str
    reason: str
    evidence: dict[str, Any] = {}


class BenchmarkCompleted(Event, tag=True, frozen=True):
    problem: str
    device: str
    source_hash: str
    median_ns: float
    iqr_ns: float
    baseline: str
    baseline_ns: float
    speedup: float
    roofline_fraction: float
    evidence: dict[str, Any] = {}


# --- the runtime's own facts --------------------------------------------------------------


class ActorStarted(Event, tag=True, frozen=True):
    reacts_to: list[str] = []
    pid: int = 0


class ActorStopped(Event, tag=True, frozen=True):
    reason: str = "stopped"


class EventRejected(Event, tag=True, frozen=True):
    """A message on `kf.ev.>` that is not a valid event; the raw bytes are kept (capped)."""

    subject: str
    stream_seq: int
    reason: str
    raw_excerpt: str


class DeadLettered(Event, tag=True, frozen=True):
    """A message a consumer gave up on after its last allowed delivery."""

    consumer: str
    subject: str
    stream_seq: int
    deliveries: int
    reason: str
    original_event_id: str | None = None


AnyEvent = (
    CampaignStarted
    | CampaignFinished
    | HostCalibrated
    | KernelVerified
    | KernelRejected
    | BenchmarkCompleted
    | ActorStarted
    | ActorStopped
    | EventRejected
    | DeadLettered
)

EVENT_TYPES: dict[str, type[Event]] = {cls.__name__: cls for cls in AnyEvent.__args__}

E = TypeVar("E", bound=Event)


def new_event(
    cls: type[E],
    *,
    campaign_id: str,
    actor: ActorRef,
    cause: Event | None = None,
    event_id: str | None = None,
    **payload: Any,
) -> E:
    """Build an event with a fresh envelope; `cause` sets causation and correlation."""
    return cls(
        event_id=event_id or new_event_id(),
        campaign_id=campaign_id,
        schema=cls.SCHEMA,
        actor=actor,
        causation_id=cause.event_id if cause else None,
        correlation_id=(cause.correlation_id or cause.event_id) if cause else None,
        ts=datetime.now(UTC),
        **payload,
    )
