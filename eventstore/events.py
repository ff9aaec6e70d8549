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
#: A KernelWritten's diff is cut beyond this many characters: with its source (which is
#: whole) it must stay well under the event cap.
MAX_DIFF_CHARS = 64 * 1024

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


class CampaignStalled(Event, tag=True, frozen=True):
    """The campaign cannot make progress, and why.

    kind: `no_design_space` or `dead_lettered` (every candidate of the last generation was
    given up on) block it until it is run again; `no_live_actor` (`role` names it) is a
    warning: the campaign goes on when one joins.
    """

    kind: str
    detail: str
    role: str = ""

    @property
    def blocks(self) -> bool:
        """Whether the campaign waits for a resume (else for an actor to join)."""
        return self.kind != "no_live_actor"


# --- the search --------------------------------------------------------------------


class CampaignResumed(Event, tag=True, frozen=True):
    """`kfactory run` found this campaign unfinished and picked it up again; or, with
    `end_search`, `kfactory best --final-run` asked for its final answer: its search ends
    at once and its current top kernels are timed together in a final run (a finished
    campaign's too, when its latest final run did not time them all)."""

    reason: str = "resumed"
    end_search: bool = False


class GenerationOpened(Event, tag=True, frozen=True):
    generation: int
    planned: int


class _Targeted(Event, frozen=True, kw_only=True):
    """Work routed to the actors serving one device target (`kf.ev.<c>.<type>.<target>`)."""

    problem: str
    target: str
    candidate_id: str
    generation: int
    dtype: str = "fp32"

    @property
    def subject_target(self) -> str | None:
        return self.target

    def work(self) -> dict[str, Any]:
        """The fields that identify this piece of work, for the events that answer it."""
        return {
            "problem": self.problem,
            "target": self.target,
            "candidate_id": self.candidate_id,
            "generation": self.generation,
            "dtype": self.dtype,
        }


class CandidateProposed(_Targeted, tag=True, frozen=True):
    """One point to evaluate: a template and its parameters, or an LLM variation."""

    template: str
    params: dict[str, Any] = {}
    param_key: str = ""
    operator: str = "sample"  # sample | improve | fix | crossover | a variation operator
    parents: list[str] = []  # candidate ids, for LLM and operator variations


class FusionPlanned(_Targeted, tag=True, frozen=True):
    """How a graph problem's chain of ops is split into fused kernels for one candidate."""

    groups: list[list[str]]
    params: dict[str, Any] = {}
    param_key: str = ""


class LlmExchanged(_Targeted, tag=True, frozen=True):
    """One conversation with an LLM, kept so that a replay never needs the LLM again."""

    operator: str
    model: str
    prompt: list[dict[str, str]]
    reply: str | None
    usage: dict[str, int] = {}
    attempts: int = 1
    error: str | None = None
    latency_s: float = 0.0


class AgentStep(_Targeted, tag=True, frozen=True):
    """One item of an LLM agent's trail while it varies a candidate (the `agent` operator):
    `kind` "reply" (the assistant's message: its text, the tool calls it asked for, the
    tokens and latency of the call), "tool" (one tool call: its arguments and its bounded
    result) or "gave_up" (the reason the variation ended without a submission). `step` is
    the LLM turn, from 1. What the agent measured for itself is advice, never evidence."""

    step: int
    kind: str  # reply | tool | gave_up
    content: str = ""
    """The assistant's text (reply) or the reason (gave_up)."""
    tool: str = ""
    call_id: str = ""
    arguments: str = ""
    """The tool call's arguments as the model sent them (JSON text, bounded)."""
    result: str = ""
    """The tool's answer as the model read it (bounded)."""
    tool_calls: list[str] = []
    """The tools the reply asked for, in order."""
    usage: dict[str, int] = {}
    latency_s: float = 0.0
    model: str = ""


class KernelWritten(_Targeted, tag=True, frozen=True):
    """A candidate's kernel source and flags, and what wrote it: a template, the fuser, an
    LLM, or a variation operator from its parents (with the diff against the first)."""

    source_hash: str
    source: str
    flags: list[str]
    writer: str  # template | fuser | llm | operator | agent
    template: str = ""
    params: dict[str, Any] = {}
    param_key: str = ""
    operator: str = ""
    """The variation operator that wrote it from its parents ("" for a template, a fusion
    plan or an LLM's kernel)."""
    parents: list[str] = []
    """The candidate ids of the parents it was varied from, the first the diff's base."""
    diff: str = ""
    """A unified diff of its source against the first parent's, at most `MAX_DIFF_CHARS`
    (cut with a marker line beyond that: the source itself is always whole)."""


class CandidateDeduplicated(_Targeted, tag=True, frozen=True):
    """This candidate's kernel was evaluated before; it is not evaluated again."""

    source_hash: str
    param_key: str
    duplicate_of: str  # the event id of the earlier evaluation


class KernelCompiled(_Targeted, tag=True, frozen=True):
    """The compile and static stages passed, on any host; the run stage needs the device.

    Targets whose devices are scarce (cuda) are pre-filtered this way, so a laptop can
    refuse what would fail and a GPU's time goes to kernels that can run."""

    source_hash: str
    arch: str
    resources: list[dict[str, Any]]
    """Per kernel, what the assembler reported: registers, shared memory, spills."""
    evidence: dict[str, Any] = {}


class KernelVerified(_Targeted, tag=True, frozen=True):
    source_hash: str
    max_rel_err: float
    trials: int
    evidence: dict[str, Any] = {}
    seed: int | None = None  # the check's secret seed: replays its shapes and inputs


class KernelRejected(_Targeted, tag=True, frozen=True):
    source_hash: str
    stage: str
    reason: str
    evidence: dict[str, Any] = {}
    seed: int | None = None  # the check's seed, when inputs were drawn (not for compile)


class HeadToHeadRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A kernel against the incumbent in one interleaved run (two when the first left it in
    doubt), as recorded: the kernel's time over the incumbent's, paired round by round.
    The benchmarker's `gpu_workers.results.HeadToHead`, under the event's own schema."""

    ratio_median: float
    ratio_q1: float
    ratio_q3: float
    rounds: int
    remeasured: bool
    wins: int | None = None  # None in events recorded before the wins were kept
    # the kernel's total time over the incumbent's in the same rounds; None before it was kept
    ratio_of_means: float | None = None
    faster: bool  # it beat the incumbent: the only way a kernel is promoted


class BenchmarkCompleted(_Targeted, tag=True, frozen=True):
    """A verified kernel timed against the baseline (and the incumbent, when there is one).

    Schema 2 holds as fields what schema 1 kept in `evidence` (the upcaster in `codec.py`
    lifts them); `evidence` keeps the rest: the judged calls, the re-checked
    distributions, the handshake cost, the device lease, the containment."""

    SCHEMA: ClassVar[int] = 2

    source_hash: str
    median_ns: float
    iqr_ns: float
    baseline: str
    baseline_ns: float
    speedup: float
    roofline_fraction: float
    device: str = ""  # the calibrated host or GPU the time belongs to
    evidence: dict[str, Any] = {}
    seed: int | None = None  # the seed of the timed and re-checked inputs
    shape: dict[str, int] = {}  # the extents it was timed at
    q1_ns: float | None = None  # the quartiles of its own run's samples
    q3_ns: float | None = None
    samples: int | None = None  # timed calls in its own run
    baseline_iqr_ns: float | None = None
    roofline_ns: float | None = None  # the least time physics allows at that shape
    incumbent: str | None = None  # the candidate it was timed against, in the same run
    speedup_vs_incumbent: float | None = None  # the incumbent's time over its own (time_ns)
    head_to_head: HeadToHeadRecord | None = None
    host_contention_cores: float | None = None  # CPU other work used during the run
    timing_attempts: int | None = None  # timing runs made; the quietest one kept
    # the mean over its timed calls (and the baseline's), which `speedup` is the ratio of:
    # moving work between calls cannot lower it; None in events recorded before
    mean_ns: float | None = None
    baseline_mean_ns: float | None = None

    @property
    def time_ns(self) -> float:
        """The kernel's time in this run as ranked: the mean over its timed calls, or, in an
        event recorded before the mean was kept, the median its figures were derived from."""
        return self.median_ns if self.mean_ns is None else self.mean_ns

    @property
    def baseline_time_ns(self) -> float:
        """The baseline's time in this run under the same rule as `time_ns`."""
        return self.baseline_ns if self.baseline_mean_ns is None else self.baseline_mean_ns


class LessonLearned(Event, tag=True, frozen=True):
    """Something the history shows, with the ids of the events it was drawn from."""

    generation: int
    kind: str  # parameter_effect | failure_signature | lineage; data["rule"]: rules version
    statement: str
    evidence_ids: list[str]
    data: dict[str, Any] = {}


class GenerationClosed(Event, tag=True, frozen=True):
    generation: int
    settled: int
    evaluated: int
    best_candidate: str | None = None
    best_speedup: float | None = None


class FinalRunRequested(Event, tag=True, frozen=True):
    """The campaign is done searching (`reason`, what its CampaignFinished will say): its
    top kernels by the ranking now (`contenders`, candidate ids) are to be timed together
    in one final run on its target before it finishes."""

    problem: str
    target: str
    contenders: list[str]
    reason: str
    dtype: str = "fp32"

    @property
    def subject_target(self) -> str | None:
        return self.target


class FinalContender(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One kernel in a final run: its figures over that run's timed calls."""

    candidate_id: str
    source_hash: str
    mean_ns: float
    median_ns: float
    q1_ns: float
    q3_ns: float
    iqr_ns: float
    rounds: int
    failure: str = ""
    """Why its judged calls in the run failed ("" when they passed): then it has no place."""


class FinalRankingTimed(Event, tag=True, frozen=True):
    """A campaign's final run: its top kernels timed together in one interleaved run (the
    head-to-head extended to N), each with its figures over the run (`contenders`, in the
    request's order), and `order`: those whose judged calls passed, by mean, fastest
    first. Rank 1 of the campaign's leaderboard is `order[0]`."""

    target: str
    device: str
    seed: int
    shape: dict[str, int]
    contenders: list[FinalContender]
    order: list[str]
    rounds: int
    baseline: str
    baseline_mean_ns: float | None = None
    host_contention_cores: float | None = None
    timed_seconds: float = 0.0

    @property
    def subject_target(self) -> str | None:
        return self.target


class FinalRunRefused(Event, tag=True, frozen=True):
    """A final run that could not be made (a back end that does not support it, a kernel
    that no longer builds or crashed): the campaign finishes on its ranking as it was."""

    target: str
    reason: str
    message: str

    @property
    def subject_target(self) -> str | None:
        return self.target


# --- devices ----------------------------------------------------------------------------


class HostCalibrated(Event, tag=True, frozen=True):
    """Measured ceilings of one device, the denominators of every roofline fraction."""

    device: str
    bandwidth_gbs: float
    peak_gflops: float
    method: dict[str, Any] = {}


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
    | CampaignResumed
    | CampaignStalled
    | GenerationOpened
    | CandidateProposed
    | FusionPlanned
    | LlmExchanged
    | AgentStep
    | KernelWritten
    | CandidateDeduplicated
    | KernelCompiled
    | KernelVerified
    | KernelRejected
    | BenchmarkCompleted
    | LessonLearned
    | GenerationClosed
    | FinalRunRequested
    | FinalRankingTimed
    | FinalRunRefused
    | HostCalibrated
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
