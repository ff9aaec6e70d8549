"""The template strategy (`writer.kind = "template"`): each generation is points of the
problem's design spaces, the seed kernels as they are and each space's best known point
first (`actors.search.spaces.starting_points`), then the points known fastest on other
kinds of host that this one's spaces hold (`known_elsewhere`), then what the optuna search
(`actors.search.template_search`, warm-started by earlier campaigns) proposes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.campaign.campaign_file import CampaignSpec
from actors.campaign.history import Campaign, History
from actors.search.spaces import known_elsewhere, starting_points
from actors.search.strategy import Filled, GenerationInputs, Planned, Stalled, fresh_points
from actors.search.template_search import Proposal, Space, TemplateSearch


class TemplateStrategy:
    def first_points(self, spec: CampaignSpec) -> list[Proposal]:
        return [*starting_points(spec), *known_elsewhere(spec)]

    def needs_known(self, generation: int, spaces: Sequence[Space]) -> bool:
        return bool(spaces)

    def fill(
        self, history: History, campaign: Campaign, generation: int, inputs: GenerationInputs
    ) -> Filled | Stalled:
        spec = campaign.spec
        if not inputs.spaces:
            return Stalled(
                "no_design_space",
                f"no design space to search for {spec.problem} on {spec.target} ({spec.dtype}): "
                "no template, seed kernel or fusion space takes it",
            )
        count, known = inputs.count, inputs.known
        proposals = fresh_points(inputs.first_points, known, count)
        if len(proposals) < count:
            taken = {p.key for p in proposals}
            proposals += TemplateSearch(inputs.spaces, spec.search.seed).propose(
                history.scope_candidates(spec.problem, spec.target, spec.dtype),
                count - len(proposals),
                generation,
                lambda p: p.key in known or p.key in taken or _avoided(p, list(inputs.avoid)),
                campaign_id=campaign.started.campaign_id,  # earlier campaigns are its prior
                shape=spec.shapes[0] if spec.shapes else None,
            )
        return Filled(
            [Planned.point(p) for p in proposals], "nothing new to try in the design space"
        )


def _avoided(proposal: Proposal, regions: list[dict[str, Any]]) -> bool:
    return any(
        region.get("template") == proposal.template
        and proposal.params.get(str(region.get("param"))) == region.get("value")
        for region in regions
    )
