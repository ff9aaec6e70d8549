"""The search strategies by the name a campaign file's `writer.kind` gives them (as Kernel
Tuner's `strategy_map` names its strategies): a new strategy is one entry here, and the
planner needs no change to use it. The campaign file's list of kinds
(`actors.campaign.campaign_file.Writer.kind`) names the same strategies."""

from __future__ import annotations

from actors.campaign.campaign_file import CampaignSpec
from actors.search.evolve_strategy import EvolveStrategy
from actors.search.llm_strategy import LlmStrategy
from actors.search.strategy import Strategy
from actors.search.template_strategy import TemplateStrategy

STRATEGIES: dict[str, type[Strategy]] = {
    "template": TemplateStrategy,
    "llm": LlmStrategy,
    "evolve": EvolveStrategy,
}


def strategy_for(spec: CampaignSpec) -> Strategy:
    """The strategy that fills the generations of the campaign `spec` describes."""
    return STRATEGIES[spec.writer.kind]()
