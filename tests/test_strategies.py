"""The search strategies' registry: the campaign file names exactly the registered
strategies, and the planner opens a generation with whatever the campaign's strategy
fills it with (a new strategy, such as a variation operator, needs no planner change)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args, get_type_hints

import pytest

from actors.campaign.campaign_file import CampaignSpec, Writer
from actors.campaign.history import Campaign, History
from actors.roles.planner import decide_planner
from actors.runtime import Reactions
from actors.search.registry import STRATEGIES
from actors.search.strategy import Filled, GenerationInputs, Planned, Stalled
from actors.search.template_search import Proposal, Space
from eventstore.events import (
    ActorRef,
    CampaignFinished,
    CampaignStalled,
    CampaignStarted,
    CandidateProposed,
    Event,
    GenerationOpened,
)
from tests.decision_log import read_log

PLANNER = ActorRef("planner", "planner-0", "test")


def test_the_campaign_file_names_exactly_the_registered_strategies() -> None:
    # `campaign` may not import `search`: the two lists are pinned equal here instead.
    kinds = get_args(get_type_hints(Writer)["kind"])
    assert set(kinds) == set(STRATEGIES) == {"template", "llm", "evolve"}
    assert Writer().kind in STRATEGIES


class _Edits:
    """A strategy the planner has never heard of: it edits the campaign's first kernel."""

    filled: Filled | Stalled = Filled(
        [
            Planned("edit", {"rule": "unroll"}, "edit:a", "edit", ["recorded:g0:c0"]),
            Planned("edit", {"rule": "tile"}, "edit:b", "edit", ["recorded:g0:c0"]),
        ],
        "nothing to edit",
    )

    def first_points(self, spec: CampaignSpec) -> list[Proposal]:
        return []

    def needs_known(self, generation: int, spaces: Sequence[Space]) -> bool:
        return False

    def fill(
        self, history: History, campaign: Campaign, generation: int, inputs: GenerationInputs
    ) -> Filled | Stalled:
        return self.filled


def _decided(monkeypatch: pytest.MonkeyPatch, filled: Filled | Stalled) -> list[Event]:
    started = read_log("softmax-two-generations.jsonl")[0]
    assert isinstance(started, CampaignStarted)
    history = History()
    history.apply(1, started)
    monkeypatch.setattr(_Edits, "filled", filled)
    monkeypatch.setitem(STRATEGIES, history.campaigns["recorded"].spec.writer.kind, _Edits)
    out = Reactions(started, PLANNER)
    decide_planner(history, started, out, now=started.ts)
    return out.events


def test_the_planner_proposes_what_the_campaigns_strategy_fills(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened, *proposed = _decided(monkeypatch, _Edits.filled)
    assert isinstance(opened, GenerationOpened) and opened.planned == 2
    assert all(isinstance(p, CandidateProposed) for p in proposed)
    assert [
        (p.candidate_id, p.template, p.params, p.param_key, p.operator, p.parents)
        for p in proposed
        if isinstance(p, CandidateProposed)
    ] == [
        ("recorded:g0:c0", "edit", {"rule": "unroll"}, "edit:a", "edit", ["recorded:g0:c0"]),
        ("recorded:g0:c1", "edit", {"rule": "tile"}, "edit:b", "edit", ["recorded:g0:c0"]),
    ]


def test_a_strategy_with_nothing_to_propose_finishes_or_stalls_the_campaign(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (finished,) = _decided(monkeypatch, Filled([], "nothing to edit"))
    assert isinstance(finished, CampaignFinished) and finished.reason == "nothing to edit"
    (stalled,) = _decided(monkeypatch, Stalled("no_parent", "no kernel to edit"))
    assert isinstance(stalled, CampaignStalled)
    assert (stalled.kind, stalled.detail) == ("no_parent", "no kernel to edit")
