"""Who may emit what: the event types of each role.

The bus grants each role's NATS user publish rights on exactly these types, and the
recorder refuses an event whose `actor.role` is not an emitter of its type. So a
benchmarker can neither publish `CampaignFinished` nor sign a `KernelWritten` as the
kernel writer.

Every actor role also emits `LIFECYCLE` (ActorStarted, ActorStopped, DeadLettered);
`cli` starts, resumes and stalls campaigns; `recorder` (the hub) reports EventRejected
and DeadLettered.
"""

from __future__ import annotations

from types import MappingProxyType

from eventstore.events import EVENT_TYPES

#: What every actor process emits about itself and about messages it gave up on.
LIFECYCLE = ("ActorStarted", "ActorStopped", "DeadLettered")

#: The role that records: rejections and dead letters reported by the hub.
RECORDER = "recorder"
#: The command line: starts and resumes campaigns.
CLI = "cli"

_EMITS: dict[str, tuple[str, ...]] = {
    "planner": (
        "GenerationOpened",
        "CandidateProposed",
        "CampaignFinished",
        "CampaignStalled",
        "FinalRunRequested",
        *LIFECYCLE,
    ),
    "kernel-writer": (
        "KernelWritten",
        "CandidateDeduplicated",
        "KernelRejected",
        "LlmExchanged",
        "AgentStep",
        *LIFECYCLE,
    ),
    "fuser": ("FusionPlanned", *LIFECYCLE),
    "compiler": ("KernelCompiled", "KernelRejected", *LIFECYCLE),
    "verifier": ("KernelVerified", "KernelRejected", *LIFECYCLE),
    "benchmarker": (
        "BenchmarkCompleted",
        "KernelRejected",
        "HostCalibrated",
        "FinalRankingTimed",
        "FinalRunRefused",
        *LIFECYCLE,
    ),
    "librarian": ("LessonLearned", "GenerationClosed", "CampaignStalled", *LIFECYCLE),
    CLI: ("CampaignStarted", "CampaignResumed", "CampaignStalled"),
    RECORDER: ("EventRejected", "DeadLettered"),
}

EMITS = MappingProxyType(_EMITS)

#: The roles that never read the store (no history, no SQL): the store service refuses
#: them its SQL and replay, so a host holding one of their credentials (a GPU host's
#: verifier) cannot read every campaign's kernels through it.
NO_STORE_READS = frozenset({"verifier", "compiler", "fuser"})

#: The roles that run as actors (each has a NATS user of the same name).
ACTOR_ROLES = tuple(role for role in _EMITS if role not in (CLI, RECORDER))


def emitters(event_type: str) -> frozenset[str]:
    """The roles allowed to emit `event_type` (empty for an unknown type)."""
    return frozenset(role for role, types in _EMITS.items() if event_type in types)


def _check() -> None:
    unknown = {t for types in _EMITS.values() for t in types} - set(EVENT_TYPES)
    if unknown:
        raise RuntimeError(f"authority names unknown event types: {sorted(unknown)}")


_check()
