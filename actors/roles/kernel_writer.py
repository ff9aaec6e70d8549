"""The kernel writer: turns a proposal (or a fusion plan) into kernel source.

Template proposals are rendered from their jinja2 template; fusion plans are generated
from the fusion IR; operator proposals (`writer.kind = "evolve"`) apply an offline
variation operator to their parents as the history holds them (`decide_operator`: the
child with its operator, parents and diff, or the refusal as the write stage's rejection);
the `agent` operator (`actors.search.agent`) is awaited here, and every item of its trail
(replies, tool calls with their bounded results, a give-up) is an AgentStep, so a
redelivered proposal emits the recorded trail again and reuses its end instead of asking
the endpoint; LLM variations (improve, fix, crossover) are asked of the campaign's
OpenAI-compatible endpoint, and every exchange is recorded as LlmExchanged, so a
redelivered proposal reuses the recorded reply instead of asking again. A kernel whose
exact source was settled before in the same dedupe scope is not evaluated again: the
writer records CandidateDeduplicated instead.

The decisions (`decide_written`, `decide_template`, `decide_fusion`, `decide_operator`,
`variation_prompt`, `decide_reply`) are functions of the history and the event
(`decide_agent` also of the recorded trail, and it runs the agent when that has no end);
`KernelWriter.handle` does the I/O around them: catching up with the store, the
librarian's lessons, the LLM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from actors.campaign.campaign_file import CampaignSpec, Writer
from actors.campaign.history import Candidate, History
from actors.campaign.replayer import HistoryReader
from actors.roles.messages import ask_lessons
from actors.runtime import Actor, PoisonMessage, Reactions
from actors.search.lineage import EVOLVE_TEMPLATE, context_for, parents_of
from actors.search.llm import prompts
from actors.search.llm.extract import NoCodeFound, extract_kernel
from actors.search.llm.prompts import RejectionEvidence
from actors.search.operators.protocol import Context, ParentKernel, Refusal, Variation
from actors.search.operators.registry import AGENT, OPERATORS
from actors.search.spaces import template_named
from actors.search.variation import LLM_TEMPLATE, WRITE
from bus.connection import Client, jetstream
from bus.device_lease import DeviceLeases, device_key
from eventstore.events import (
    MAX_DIFF_CHARS,
    ActorRef,
    AgentStep,
    CandidateDeduplicated,
    CandidateProposed,
    Event,
    FusionPlanned,
    HostCalibrated,
    KernelRejected,
    KernelWritten,
    LlmExchanged,
)
from eventstore.queries import replay
from gpu_workers.targets import target_of, worker_device_index
from kernels.design_space import InvalidParams, Template
from kernels.fusion.plan import plan as fusion_plan
from kernels.identity import source_hash
from kernels.loading import load_problem
from kernels.spec import Problem
from kernels.templates import TEMPLATES
from kernels.user_spaces import SpaceError

if TYPE_CHECKING:  # the agent's modules import openai (~0.4 s): only agent campaigns need it
    from actors.search.agent.loop import Hold


@dataclass(frozen=True)
class Kernel:
    """A kernel as a writer produced it, before it is recorded."""

    source: str
    flags: list[str]
    writer: str  # template | fuser | llm | operator | agent
    params: dict[str, object] = field(default_factory=dict)
    operator: str = ""
    parents: list[str] = field(default_factory=list)
    diff: str = ""


# --- decisions: the history and the event in, reactions out --------------------------------


def decide_written(
    history: History, cause: CandidateProposed | FusionPlanned, out: Reactions, kernel: Kernel
) -> None:
    """KernelWritten, or CandidateDeduplicated when another candidate of the campaign's
    dedupe scope had this exact source (and flags) and is settled: that outcome stands
    for this one. A candidate still in flight with the same source is no duplicate yet."""
    digest = source_hash(kernel.source, kernel.flags)
    common = {**cause.work(), "param_key": cause.param_key}
    earlier = _settled_with_source(history, cause, digest)
    if earlier is not None:
        outcome = earlier.outcome_event
        assert outcome is not None
        out.emit(CandidateDeduplicated, source_hash=digest, duplicate_of=outcome.event_id, **common)
        return
    out.emit(
        KernelWritten,
        source_hash=digest,
        source=kernel.source,
        flags=kernel.flags,
        writer=kernel.writer,
        template=cause.template if isinstance(cause, CandidateProposed) else "fusion",
        params=dict(kernel.params),
        operator=kernel.operator,
        parents=list(kernel.parents),
        diff=kernel.diff,
        **common,
    )


def bounded_diff(diff: str) -> str:
    """The diff, cut at `MAX_DIFF_CHARS` with a line saying so."""
    if len(diff) <= MAX_DIFF_CHARS:
        return diff
    return diff[:MAX_DIFF_CHARS] + f"\n... diff cut at {MAX_DIFF_CHARS} of {len(diff)} characters\n"


def decide_operator(
    history: History, event: CandidateProposed, out: Reactions, context: Context
) -> None:
    """Apply a variation operator to the proposal's parents: its child is written (or
    deduplicated); a refusal is the write stage's rejection, with the operator named."""
    operator = OPERATORS.get(event.operator)
    if operator is None:
        raise PoisonMessage(f"{event.candidate_id}: no operator {event.operator!r}")
    child = operator.apply(recorded_parents(history, event), event.params, context)
    decide_child(history, event, out, child, "operator")


def recorded_parents(history: History, event: CandidateProposed) -> list[ParentKernel]:
    """The proposal's parents as the history holds them; a poison message without them."""
    parents = parents_of(history, event.parents)
    if not parents:
        raise PoisonMessage(
            f"{event.candidate_id}: operator {event.operator!r} on parents {event.parents} "
            "with no recorded kernel"
        )
    return parents


def decide_child(
    history: History,
    event: CandidateProposed,
    out: Reactions,
    child: Variation | Refusal,
    writer: str,
) -> None:
    """An operator's child is written (or deduplicated) as `writer`'s; a refusal is the
    write stage's rejection, with the operator named."""
    if isinstance(child, Refusal):
        out.emit(
            KernelRejected,
            stage="write",
            reason=child.reason,
            evidence={"message": child.message, "operator": child.operator},
            source_hash="",
            **event.work(),
        )
        return
    kernel = Kernel(
        child.source,
        list(child.flags),
        writer,
        dict(child.params),
        operator=child.operator,
        parents=list(child.parents),
        diff=bounded_diff(child.diff),
    )
    decide_written(history, event, out, kernel)


def _settled_with_source(
    history: History, cause: CandidateProposed | FusionPlanned, digest: str
) -> Candidate | None:
    if cause.campaign_id not in history.campaigns:
        raise PoisonMessage(f"campaign {cause.campaign_id} of {cause.candidate_id} is not recorded")
    earlier = history.seen_source(cause.campaign_id, digest, cause.candidate_id)
    return earlier if earlier is not None and earlier.outcome_event is not None else None


def decide_template(
    history: History, event: CandidateProposed, out: Reactions, template: Template | None
) -> None:
    """Render a template proposal; parameters the template refuses are a poison message.
    A proposal of a fusion space (no template) is the fuser's: nothing here."""
    if template is None:
        return
    try:
        rendered = template.render(event.params, event.dtype)
    except InvalidParams as exc:
        raise PoisonMessage(str(exc)) from exc
    kernel = Kernel(rendered.source, list(rendered.flags), "template", event.params)
    decide_written(history, event, out, kernel)


def decide_fusion(history: History, event: FusionPlanned, out: Reactions) -> None:
    """Generate the fused kernels of a fusion plan."""
    try:
        plan = fusion_plan(event.problem, event.groups, event.params, event.target, event.dtype)
    except InvalidParams as exc:
        raise PoisonMessage(str(exc)) from exc
    decide_written(
        history, event, out, Kernel(plan.source, list(plan.flags), "fuser", event.params)
    )


def variation_prompt(
    history: History,
    event: CandidateProposed,
    problem: Problem,
    lessons: list[str],
    ceilings: prompts.HostCeilings | None = None,
) -> list[dict[str, str]]:
    """The messages for an LLM variation: write from the problem alone (a blank page),
    fix a rejected parent with its rejection's evidence, cross two parents over, or
    improve one."""
    if event.operator == WRITE:
        return prompts.write(
            problem, lessons, target=event.target, dtype=event.dtype, ceilings=ceilings
        )
    parents = [history.candidates.get(p) for p in event.parents]
    written = [p.written for p in parents if p is not None and p.written is not None]
    if not event.parents or len(written) != len(event.parents):
        raise PoisonMessage(
            f"{event.candidate_id} varies parents with no recorded kernel: {event.parents}"
        )
    first = parents[0]
    assert first is not None
    if event.operator == "fix" and first.rejected is not None:
        rejected = first.rejected
        evidence = RejectionEvidence(
            stage=rejected.stage,
            reason=rejected.reason,
            message=str(rejected.evidence.get("message", "")),
            evidence=rejected.evidence,
        )
        return prompts.fix(problem, written[0].source, evidence, lessons, target=event.target)
    if event.operator == "crossover" and len(written) == 2:
        return prompts.crossover(
            problem, written[0].source, written[1].source, lessons, target=event.target
        )
    return prompts.improve(problem, written[0].source, lessons, target=event.target)


def decide_reply(
    history: History,
    event: CandidateProposed,
    out: Reactions,
    reply: str | None,
    problem: Problem,
) -> None:
    """An LLM's reply to a variation: no reply and a reply without code are the write
    stage's rejections; the kernel in a reply is written (or deduplicated)."""
    common = {**event.work(), "source_hash": ""}
    if reply is None:
        out.emit(
            KernelRejected,
            stage="write",
            reason="llm_failed",
            evidence={"message": "the LLM gave no reply; see the LlmExchanged event"},
            **common,
        )
        return
    try:
        kernel = extract_kernel(reply, problem)
    except NoCodeFound as exc:
        out.emit(
            KernelRejected,
            stage="write",
            reason="no_code",
            evidence={"message": str(exc)},
            **common,
        )
        return
    flags = list(kernel.flags or target_of(event.target).default_flags)
    decide_written(history, event, out, Kernel(kernel.source, flags, "llm", event.params))


async def decide_agent(
    history: History,
    event: CandidateProposed,
    out: Reactions,
    spec: CampaignSpec,
    context: Context,
    trail: list[AgentStep],
    hold: Hold | None = None,
) -> None:
    """The agent operator's variation (its tools run while `hold` holds a share of the
    device; None: no device is shared), every item of its trail an AgentStep, its child
    written as the agent's (or its give-up the write stage's rejection). A `trail` recorded
    by an earlier delivery that has an end is emitted again as it was (so with the same
    event ids) and that end is reused: the endpoint is not asked again."""
    # Imported here: openai takes ~0.4 s to import, and only agent campaigns need it.
    from actors.search.agent.operator import AgentOperator, outcome, recorded_outcome

    parents = recorded_parents(history, event)
    ended = recorded_outcome(trail, parents[0].flags)
    if ended is not None:
        for step in trail:
            out.emit(AgentStep, **agent_step_fields(step), **event.work())
        child = outcome(parents, event.params, ended)
    else:
        problem = await asyncio.to_thread(load_problem, event.problem)
        shape = dict(zip(problem.dims, spec.shapes[0], strict=True)) if spec.shapes else None

        record = functools.partial(out.emit, AgentStep, **event.work())
        agent = AgentOperator(spec.writer, problem, event.dtype, shape, record)
        if hold is not None:
            agent = dataclasses.replace(agent, hold=hold)
        child = await agent.apply(parents, event.params, context)
    decide_child(history, event, out, child, AGENT)


def agent_step_fields(step: AgentStep) -> dict[str, Any]:
    """A recorded AgentStep's own fields (not the envelope, not the work's)."""
    shared = set(Event.__struct_fields__) | set(step.work())
    return {name: getattr(step, name) for name in AgentStep.__struct_fields__ if name not in shared}


# --- the actor: I/O at the edges --------------------------------------------------------


class KernelWriter(Actor):
    role = "kernel-writer"
    reacts_to = (CandidateProposed, FusionPlanned)

    def __init__(self) -> None:
        self._nc: Client | None = None
        self._ref: ActorRef | None = None
        self._reader: HistoryReader | None = None
        self._leases: DeviceLeases | None = None

    async def setup(self, nc: Client, ref: ActorRef) -> None:
        self._nc = nc
        self._ref = ref
        self._reader = HistoryReader(nc)

    async def handle(self, event: Event, out: Reactions) -> None:
        assert self._reader is not None
        if isinstance(event, CandidateProposed):
            # The proposal is recorded once this returns, and with it every candidate
            # settled before it was made.
            history = await self._reader.catch_up(event.event_id)
            if event.template == LLM_TEMPLATE:
                await self._vary(history, event, out)
            elif event.template == EVOLVE_TEMPLATE:
                await self._apply_operator(history, event, out)
            else:
                decide_template(history, event, out, self._template(history, event))
        elif isinstance(event, FusionPlanned):
            # A plan is no history event; the proposal it answers is.
            history = await self._reader.catch_up(event.causation_id)
            decide_fusion(history, event, out)

    async def _apply_operator(
        self, history: History, event: CandidateProposed, out: Reactions
    ) -> None:
        assert self._nc is not None
        campaign = history.campaigns.get(event.campaign_id)
        if campaign is None:
            raise PoisonMessage(
                f"campaign {event.campaign_id} of {event.candidate_id} is not recorded"
            )
        lessons = [x.statement for x in await ask_lessons(self._nc, event.campaign_id)]
        context = await asyncio.to_thread(context_for, campaign.spec, lessons)
        if event.operator == AGENT:
            trail = await self._recorded_trail(event)
            hold = await self._device_share(event.target)
            await decide_agent(history, event, out, campaign.spec, context, trail, hold)
        else:
            decide_operator(history, event, out, context)

    async def _device_share(self, target: str) -> Hold:
        """How the agent's tools hold a share of this host's `target` device, as a
        verifier does (the leases are opened on first use)."""
        assert self._nc is not None and self._ref is not None
        if self._leases is None:
            self._leases = await DeviceLeases.open(jetstream(self._nc), self._ref.instance)
        leases = self._leases
        device = device_key(target, self._ref.host, worker_device_index(target))
        return lambda: leases.shared(device, self.status)

    async def _recorded_trail(self, event: CandidateProposed) -> list[AgentStep]:
        """The AgentSteps recorded for this candidate by an earlier delivery, in order."""
        assert self._nc is not None
        return [
            recorded
            for _, recorded in await replay(
                self._nc, campaign_id=event.campaign_id, types=["AgentStep"]
            )
            if isinstance(recorded, AgentStep) and recorded.candidate_id == event.candidate_id
        ]

    async def _vary(self, history: History, event: CandidateProposed, out: Reactions) -> None:
        assert self._nc is not None
        campaign = history.campaigns.get(event.campaign_id)
        if campaign is None:
            raise PoisonMessage(
                f"campaign {event.campaign_id} of {event.candidate_id} is not recorded"
            )
        problem = await asyncio.to_thread(load_problem, event.problem)
        lessons = [x.statement for x in await ask_lessons(self._nc, event.campaign_id)]
        ceilings = await self._ceilings() if event.operator == WRITE else None
        messages = variation_prompt(history, event, problem, lessons, ceilings)
        recorded = await self._recorded_reply(event)
        reply = recorded or await self._ask(event, campaign.spec.writer, messages, out)
        decide_reply(history, event, out, reply, problem)

    async def _ask(
        self,
        event: CandidateProposed,
        writer: Writer,
        messages: list[dict[str, str]],
        out: Reactions,
    ) -> str | None:
        # Imported here: openai takes ~0.4 s to import, and only LLM campaigns need it.
        from actors.search.llm.client import LlmClient, LlmConfig, LlmConfigError, LlmFailed

        config = LlmConfig.of(writer)
        exchange: dict[str, Any] = {
            **event.work(),
            "operator": event.operator,
            "prompt": messages,
        }
        try:
            async with LlmClient(config) as client:
                reply = await client.complete(messages)
        except LlmFailed as exc:
            out.emit(
                LlmExchanged,
                model=config.model,
                reply=None,
                attempts=exc.attempts,
                error=f"{exc.reason}: {exc}",
                **exchange,
            )
            return None
        except LlmConfigError as exc:
            raise PoisonMessage(f"the campaign's writer cannot be used: {exc}") from exc
        out.emit(
            LlmExchanged,
            model=reply.model,
            reply=reply.text,
            usage=reply.usage,
            attempts=reply.attempts,
            latency_s=reply.latency_s,
            **exchange,
        )
        return reply.text

    async def _recorded_reply(self, event: CandidateProposed) -> str | None:
        """The reply recorded for this candidate by an earlier delivery, if any."""
        assert self._nc is not None
        for _, recorded in await replay(
            self._nc, campaign_id=event.campaign_id, types=["LlmExchanged"]
        ):
            if isinstance(recorded, LlmExchanged) and recorded.candidate_id == event.candidate_id:
                return recorded.reply
        return None

    async def _ceilings(self) -> prompts.HostCeilings | None:
        """The last host calibration recorded, for a kernel written from a blank page."""
        assert self._nc is not None
        found = [
            e
            for _, e in await replay(self._nc, types=["HostCalibrated"])
            if isinstance(e, HostCalibrated)
        ]
        if not found:
            return None
        last = found[-1]
        return prompts.HostCeilings(last.device, last.bandwidth_gbs, last.peak_gflops)

    @staticmethod
    def _template(history: History, event: CandidateProposed) -> Template | None:
        """The proposal's template: a built-in, or one of the campaign's own spaces (read
        from the user's files); None for a fusion space, which the fuser answers."""
        campaign = history.campaigns.get(event.campaign_id)
        if campaign is None:
            raise PoisonMessage(
                f"campaign {event.campaign_id} of {event.candidate_id} is not recorded"
            )
        try:
            return TEMPLATES.get(event.template) or template_named(campaign.spec, event.template)
        except SpaceError as exc:
            raise PoisonMessage(str(exc)) from exc
