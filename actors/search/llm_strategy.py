"""The LLM strategy (`writer.kind = "llm"`): generation 0 is the templates' best points
and the seed kernels (the archive's first residents), or kernels written from a blank
page when there are none; later generations are variations of the archive's kernels
(`actors.search.variation`), which the kernel writer asks the LLM for."""

from __future__ import annotations

from collections.abc import Sequence

from actors.campaign.campaign_file import CampaignSpec
from actors.campaign.history import Campaign, History
from actors.search.spaces import starting_points
from actors.search.strategy import Filled, GenerationInputs, Planned, Stalled, fresh_points
from actors.search.template_search import Proposal, Space
from actors.search.variation import LLM_TEMPLATE, Variation, blank_page, variations


class LlmStrategy:
    def first_points(self, spec: CampaignSpec) -> list[Proposal]:
        return starting_points(spec)

    def needs_known(self, generation: int, spaces: Sequence[Space]) -> bool:
        return generation == 0 and bool(spaces)  # variations have keys of their own

    def fill(
        self, history: History, campaign: Campaign, generation: int, inputs: GenerationInputs
    ) -> Filled | Stalled:
        campaign_id = campaign.started.campaign_id
        if generation > 0:
            candidates = history.campaign_candidates(campaign_id)
            chosen = variations(candidates, inputs.count, generation, campaign.spec.search.seed)
            return Filled(
                [_candidate(v, campaign_id, generation) for v in chosen],
                "no parent to vary: every kernel so far failed before writing",
            )
        proposals = fresh_points(inputs.first_points, inputs.known, inputs.count)
        if proposals:
            return Filled(
                [Planned.point(p) for p in proposals], "nothing new to try in the design space"
            )
        # no template, no seed: the LLM writes from the problem alone
        written = blank_page(inputs.count)
        return Filled([_candidate(v, campaign_id, 0) for v in written], "nothing to write")


def _candidate(variation: Variation, campaign_id: str, generation: int) -> Planned:
    return Planned(
        LLM_TEMPLATE,
        {"family": variation.family},
        variation.key(campaign_id, generation),
        variation.operator,
        variation.parents,
    )
