"""What fills a generation of a campaign: the `Strategy` protocol every search strategy
keeps, and what a strategy hands the planner (the candidates of a generation, or why
the campaign cannot go on).

A strategy decides from the replayed history and plain inputs only, so the same history
fills a generation with the same candidates, in the same order, whoever decides it (a
resumed planner, a replay test). `actors.search.registry` says which strategy a
campaign's `writer.kind` names.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Protocol

from actors.campaign.campaign_file import CampaignSpec
from actors.campaign.history import Campaign, History
from actors.search.template_search import Proposal, Space


@dataclass(frozen=True)
class GenerationInputs:
    """What the planner gathered to fill a generation, besides the history: how many
    candidates to propose at most, the problem's design spaces (none when they cannot be
    loaded), the strategy's first points for the campaign, the keys already proposed in
    the campaign's dedupe scope (never proposed again) and the regions lessons say to
    avoid (`template`, `param`, `value`)."""

    count: int
    spaces: Sequence[Space]
    first_points: Sequence[Proposal]
    known: Set[str]
    avoid: Sequence[dict[str, Any]]


@dataclass(frozen=True)
class Planned:
    """One candidate of a generation: the fields of its CandidateProposed that the
    strategy chose (the planner adds the problem, target, generation and id)."""

    template: str
    params: dict[str, Any]
    param_key: str
    operator: str = "sample"
    parents: list[str] = field(default_factory=list)

    @classmethod
    def point(cls, proposal: Proposal) -> Planned:
        """A point of a design space, evaluated as it is."""
        return cls(proposal.template, proposal.params, proposal.key)


@dataclass(frozen=True)
class Filled:
    """A generation's candidates; with none, the campaign finishes for `reason_if_none`."""

    candidates: list[Planned]
    reason_if_none: str


@dataclass(frozen=True)
class Stalled:
    """The campaign cannot go on until it is run again (a CampaignStalled's kind, detail)."""

    kind: str
    detail: str


class Strategy(Protocol):
    """How a campaign's generations are filled."""

    def first_points(self, spec: CampaignSpec) -> list[Proposal]:
        """The points generation 0 starts from, read from the problem's and the
        campaign's files (they may be missing: the caller handles the error)."""
        ...

    def needs_known(self, generation: int, spaces: Sequence[Space]) -> bool:
        """Whether filling `generation` needs the keys already known and the regions to
        avoid: its candidates are points of the design spaces, which the librarian may
        know (candidates with keys of their own do not)."""
        ...

    def fill(
        self, history: History, campaign: Campaign, generation: int, inputs: GenerationInputs
    ) -> Filled | Stalled:
        """Up to `inputs.count` candidates for `generation`; a pure function of its
        arguments."""
        ...


def fresh_points(first_points: Sequence[Proposal], known: Set[str], count: int) -> list[Proposal]:
    """The first points not known yet, at most `count`, in their order."""
    return [p for p in first_points if p.key not in known][:count]
