"""The kernel writer: turns a proposal (or a fusion plan) into kernel source.

Template proposals are rendered from their jinja2 template; fusion plans are generated
from the fusion IR. A kernel whose exact source was settled before in the same dedupe
scope is not evaluated again: the writer records CandidateDeduplicated instead.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client

from actors.devices import source_hash
from actors.librarian import SeenRequest, ask_seen
from actors.runtime import Actor, PoisonMessage, Reactions
from eventstore.events import (
    ActorRef,
    CandidateDeduplicated,
    CandidateProposed,
    Event,
    FusionPlanned,
    KernelWritten,
)
from kernels.fusion.plan import render_plan
from kernels.templates import TEMPLATES, InvalidParams


class KernelWriter(Actor):
    role = "kernel-writer"
    reacts_to = (CandidateProposed, FusionPlanned)

    def __init__(self) -> None:
        self._nc: Client | None = None

    async def setup(self, nc: Client, ref: ActorRef) -> None:
        self._nc = nc

    async def handle(self, event: Event, out: Reactions) -> None:
        if isinstance(event, CandidateProposed):
            if event.template not in TEMPLATES:
                return  # fusion spaces go through the fuser; LLM variations elsewhere
            try:
                rendered = TEMPLATES[event.template].render(event.params)
            except InvalidParams as exc:
                raise PoisonMessage(str(exc)) from exc
            await self._written(
                event, out, rendered.source, list(rendered.flags), "template", event.params
            )
        elif isinstance(event, FusionPlanned):
            plan = render_plan(event.problem, event.groups, event.params, event.target)
            await self._written(event, out, plan.source, list(plan.flags), "fuser", event.params)

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
        common: dict[str, Any] = {
            "problem": cause.problem,
            "target": cause.target,
            "candidate_id": cause.candidate_id,
            "generation": cause.generation,
            "param_key": cause.param_key,
        }
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
