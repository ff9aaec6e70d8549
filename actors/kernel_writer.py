"""The kernel writer: turns a proposal (or a fusion plan) into kernel source.

Template proposals are rendered from their jinja2 template; fusion plans are generated
from the fusion IR; LLM variations (improve, fix, crossover) are asked of the campaign's
OpenAI-compatible endpoint, and every exchange is recorded as LlmExchanged, so a
redelivered proposal reuses the recorded reply instead of asking again. A kernel whose
exact source was settled before in the same dedupe scope is not evaluated again: the
writer records CandidateDeduplicated instead.
"""

from __future__ import annotations

from typing import Any

from actors.campaign import CampaignSpec, Writer, decode_config
from actors.devices import source_hash
from actors.librarian import SeenRequest, ask_kernel, ask_lessons, ask_seen
from actors.llm import prompts
from actors.llm.extract import NoCodeFound, extract_kernel
from actors.llm.prompts import DEFAULT_FLAGS, RejectionEvidence
from actors.runtime import Actor, PoisonMessage, Reactions
from actors.spaces import template_named
from actors.variation import LLM_TEMPLATE, WRITE
from bus.connection import Client
from eventstore.events import (
    ActorRef,
    CampaignStarted,
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
from kernels.design_space import InvalidParams
from kernels.fusion.plan import plan as fusion_plan
from kernels.loading import load_problem
from kernels.templates import TEMPLATES
from kernels.user_spaces import SpaceError


class KernelWriter(Actor):
    role = "kernel-writer"
    reacts_to = (CandidateProposed, FusionPlanned)

    def __init__(self) -> None:
        self._nc: Client | None = None
        self._campaigns: dict[str, CampaignSpec] = {}

    async def setup(self, nc: Client, ref: ActorRef) -> None:
        self._nc = nc

    async def handle(self, event: Event, out: Reactions) -> None:
        if isinstance(event, CandidateProposed):
            if event.template == LLM_TEMPLATE:
                await self._vary(event, out)
                return
            try:
                template = TEMPLATES.get(event.template) or template_named(
                    await self._campaign(event.campaign_id), event.template
                )
                if template is None:
                    return  # fusion spaces go through the fuser
                rendered = template.render(event.params, event.dtype)
            except (InvalidParams, SpaceError) as exc:
                raise PoisonMessage(str(exc)) from exc
            await self._written(
                event, out, rendered.source, list(rendered.flags), "template", event.params
            )
        elif isinstance(event, FusionPlanned):
            try:
                plan = fusion_plan(
                    event.problem, event.groups, event.params, event.target, event.dtype
                )
            except InvalidParams as exc:
                raise PoisonMessage(str(exc)) from exc
            await self._written(event, out, plan.source, list(plan.flags), "fuser", event.params)

    async def _vary(self, event: CandidateProposed, out: Reactions) -> None:
        assert self._nc is not None
        problem = load_problem(event.problem)
        writer = (await self._campaign(event.campaign_id)).writer
        parents = [await ask_kernel(self._nc, event.campaign_id, p) for p in event.parents]
        known = [p for p in parents if p is not None]
        if len(known) != len(event.parents):
            raise RuntimeError(f"parents of {event.candidate_id} are not all written yet")
        lessons = [x.statement for x in await ask_lessons(self._nc, event.campaign_id)]
        if event.operator == WRITE:
            messages = prompts.write(
                problem,
                lessons,
                target=event.target,
                dtype=event.dtype,
                ceilings=await self._ceilings(),
            )
        elif event.operator == "fix" and known[0].rejection is not None:
            r = known[0].rejection
            evidence = RejectionEvidence(
                stage=str(r["stage"]),
                reason=str(r["reason"]),
                message=str(r["evidence"].get("message", "")),
                evidence=r["evidence"],
            )
            messages = prompts.fix(problem, known[0].source, evidence, lessons, target=event.target)
        elif event.operator == "crossover" and len(known) == 2:
            messages = prompts.crossover(
                problem, known[0].source, known[1].source, lessons, target=event.target
            )
        else:
            messages = prompts.improve(problem, known[0].source, lessons, target=event.target)
        reply = await self._recorded_reply(event) or await self._ask(event, writer, messages, out)
        common = event.work()
        if reply is None:
            out.emit(
                KernelRejected,
                source_hash="",
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
                source_hash="",
                stage="write",
                reason="no_code",
                evidence={"message": str(exc)},
                **common,
            )
            return
        flags = list(kernel.flags or DEFAULT_FLAGS.split())
        await self._written(event, out, kernel.source, flags, "llm", event.params)

    async def _ask(
        self,
        event: CandidateProposed,
        writer: Writer,
        messages: list[dict[str, str]],
        out: Reactions,
    ) -> str | None:
        # Imported here: openai takes ~0.4 s to import, and only LLM campaigns need it.
        from actors.llm.client import LlmClient, LlmConfig, LlmConfigError, LlmFailed

        config = LlmConfig(
            base_url=writer.base_url or "",
            model=writer.model or "",
            api_key_env=writer.api_key_env,
            timeout_s=writer.timeout_s,
            max_attempts=writer.attempts,
            backoff_base_s=writer.backoff_s,
        )
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

    async def _campaign(self, campaign_id: str) -> CampaignSpec:
        assert self._nc is not None
        if campaign_id not in self._campaigns:
            for _, started in await replay(
                self._nc, campaign_id=campaign_id, types=["CampaignStarted"]
            ):
                if isinstance(started, CampaignStarted):
                    self._campaigns[campaign_id] = decode_config(started.config)
        if campaign_id not in self._campaigns:
            raise RuntimeError(f"campaign {campaign_id} has not been recorded yet")
        return self._campaigns[campaign_id]

    async def _written(
        self,
        cause: CandidateProposed | FusionPlanned,
        out: Reactions,
        source: str,
        flags: list[str],
        writer: str,
        params: dict[str, object],
    ) -> None:
        assert self._nc is not None
        digest = source_hash(source, flags)
        reply = await ask_seen(
            self._nc,
            SeenRequest(cause.campaign_id, source_hash=digest, candidate_id=cause.candidate_id),
        )
        common = {**cause.work(), "param_key": cause.param_key}
        if reply.source_duplicate_of is not None:
            out.emit(
                CandidateDeduplicated,
                source_hash=digest,
                duplicate_of=reply.source_duplicate_of,
                **common,
            )
            return
        template = cause.template if isinstance(cause, CandidateProposed) else "fusion"
        out.emit(
            KernelWritten,
            source_hash=digest,
            source=source,
            flags=flags,
            writer=writer,
            template=template,
            params=dict(params),
            **common,
        )
