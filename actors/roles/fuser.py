"""The fuser: for graph problems, turns a proposal over the fusion space into a plan
(which ops run fused in which kernel), recorded as FusionPlanned for the writer."""

from __future__ import annotations

from actors.runtime import Actor, PoisonMessage, Reactions
from eventstore.events import CandidateProposed, Event, FusionPlanned
from kernels.fusion.plan import groups_of
from kernels.fusion.space import FUSION_SPACE_NAME


class Fuser(Actor):
    role = "fuser"
    reacts_to = (CandidateProposed,)

    async def handle(self, event: Event, out: Reactions) -> None:
        assert isinstance(event, CandidateProposed)
        if event.template != FUSION_SPACE_NAME:
            return
        try:
            groups = groups_of(event.problem, event.params, event.target)
        except ValueError as exc:
            raise PoisonMessage(str(exc)) from exc
        out.emit(
            FusionPlanned,
            groups=groups,
            params=event.params,
            param_key=event.param_key,
            **event.work(),
        )
