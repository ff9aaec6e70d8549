"""A search that learns across campaigns (`actors.search.priors`,
`actors.search.template_search`): a warm study proposes the earlier campaigns' best
points first and never a point they rejected as a wrong kernel; with no earlier campaign
it is the cold study, unchanged; the same history gives the same proposals. From built
events, and from the recorded campaign's log."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from actors.campaign.campaign_file import CampaignSpec
from actors.campaign.history import Candidate, History, param_key
from actors.campaign.ranking import relative_speeds
from actors.roles.planner import decide_planner
from actors.runtime import Reactions
from actors.search.priors import prior_of, shape_similarity
from actors.search.spaces import design_spaces
from actors.search.template_search import PRIOR_FLOOR, Proposal, TemplateSearch
from eventstore.events import (
    ActorRef,
    BenchmarkCompleted,
    CampaignStarted,
    CandidateProposed,
    Event,
    KernelRejected,
    new_event,
)
from kernels.templates import TEMPLATES
from tests.decision_log import read_log

ACTOR = ActorRef("benchmarker", "benchmarker-0", "test")


@dataclass(frozen=True)
class Param:
    name: str
    choices: tuple[Any, ...]


@dataclass(frozen=True)
class Space:
    name: str
    params: tuple[Param, ...]

    def is_valid(self, params: Any) -> bool:
        return True

    def canonical(self, params: Any) -> dict[str, Any]:
        return dict(params)  # no structure fixes a parameter

    def completed(self, params: Any) -> dict[str, Any]:
        return dict(params)  # no parameter was added after the points were recorded


SPACE = Space("toy", (Param("a", (1, 2, 3, 4)), Param("b", ("x", "y", "z")), Param("c", (0, 1))))
POINTS = [
    dict(zip(("a", "b", "c"), v, strict=True))
    for v in itertools.product(*(p.choices for p in SPACE.params))
]


def speed(point: dict[str, Any]) -> float:
    """A made-up landscape: a=4, b=z, c=1 is best."""
    return 1.0 + point["a"] + {"x": 0, "y": 1, "z": 3}[point["b"]] + 2 * point["c"]


class Campaigns:
    """Settled candidates of several campaigns of one problem, as the history holds them."""

    def __init__(self) -> None:
        self.candidates: list[Candidate] = []

    def add(
        self,
        campaign: str,
        point: dict[str, Any],
        *,
        speedup: float | None = None,
        median_ns: float | None = None,
        rejected_at: str | None = None,
        shape: tuple[int, int] = (256, 4096),
        device: str = "vm",
    ) -> None:
        common: dict[str, Any] = {
            "campaign_id": campaign,
            "actor": ACTOR,
            "problem": "toy",
            "target": "cpu",
            "candidate_id": f"{campaign}:c{len(self.candidates)}",
            "generation": 0,
        }
        proposal = new_event(
            CandidateProposed,
            template="toy",
            params=point,
            param_key=param_key("toy", point),
            **common,
        )
        if rejected_at is not None:
            rejected = new_event(
                KernelRejected, source_hash="", stage=rejected_at, reason="x", **common
            )
            self.candidates.append(Candidate(proposal=proposal, rejected=rejected))
            return
        value = speed(point) if speedup is None else speedup
        timed = new_event(
            BenchmarkCompleted,
            source_hash="",
            median_ns=1e6 / value if median_ns is None else median_ns,
            iqr_ns=0.0,
            baseline="numpy",
            baseline_ns=1e6,
            speedup=value,
            roofline_fraction=0.1,
            device=device,
            shape={"rows": shape[0], "cols": shape[1]},
            **common,
        )
        self.candidates.append(Candidate(proposal=proposal, benchmark=timed))


def never(_: Proposal) -> bool:
    return False


def ranked_keys(campaigns: Campaigns) -> list[str]:
    return [key for key, _ in prior_of(campaigns.candidates, "b", (2048, 512)).ranked(PRIOR_FLOOR)]


def test_a_warm_study_proposes_the_earlier_campaigns_best_points_first() -> None:
    earlier = Campaigns()
    for point in POINTS:
        earlier.add("a", point)
    best_first = sorted(POINTS, key=lambda p: -speed(p))
    near = [p for p in best_first if speed(p) >= PRIOR_FLOOR * speed(best_first[0])]
    assert 1 < len(near) < 6
    proposed = TemplateSearch([SPACE], seed=3).propose(
        earlier.candidates, 6, 0, never, campaign_id="b", shape=(2048, 512)
    )
    assert [p.params for p in proposed[: len(near)]] == near
    assert ranked_keys(earlier) == [param_key("toy", p) for p in near]
    # once the campaign has timed a kernel of its own, the study alone decides
    earlier.add("b", near[0], shape=(2048, 512))
    later = TemplateSearch([SPACE], seed=3).propose(
        earlier.candidates, 6, 1, lambda p: p.key == param_key("toy", near[0]), campaign_id="b"
    )
    assert len(later) == 6 and param_key("toy", near[0]) not in {p.key for p in later}


def test_points_an_earlier_campaign_rejected_as_wrong_kernels_are_never_proposed() -> None:
    earlier = Campaigns()
    best = max(POINTS, key=speed)
    earlier.add("a", best, rejected_at="compare")  # the best-looking region, but wrong
    wrong = [p for p in POINTS if p["a"] == 3][:4]
    for point in wrong:
        earlier.add("a", point, rejected_at="compile")
    timing_refusal = {"a": 1, "b": "x", "c": 0}  # the host's doing: may be tried again
    earlier.add("a", timing_refusal, rejected_at="timing")
    for point in POINTS[:6]:
        if point != timing_refusal:
            earlier.add("a", point)
    refused = {param_key("toy", p) for p in [best, *wrong]}
    prior = prior_of(earlier.candidates, "b", None)
    assert prior.refused() == refused  # the timing refusal is not among them
    seen: set[str] = set()

    def taken(p: Proposal) -> bool:
        return p.key in seen

    for generation in range(3):  # 15 of the 19 points left
        proposed = TemplateSearch([SPACE], seed=5).propose(
            earlier.candidates, 5, generation, taken, campaign_id="b"
        )
        assert len(proposed) == 5
        seen |= {p.key for p in proposed}
    assert len(seen) == 15 and not seen & refused


def test_with_no_earlier_campaign_the_study_is_the_cold_one_and_deterministic() -> None:
    own = Campaigns()
    for point in POINTS[::5]:
        own.add("b", point)
    seen = {c.proposal.param_key for c in own.candidates}

    def taken(p: Proposal) -> bool:
        return p.key in seen

    cold = TemplateSearch([SPACE], seed=7).propose(own.candidates, 4, 1, taken)
    scoped = TemplateSearch([SPACE], seed=7).propose(own.candidates, 4, 1, taken, campaign_id="b")
    assert [p.key for p in scoped] == [p.key for p in cold]
    assert prior_of(own.candidates, "b", None).empty
    own_and_earlier = Campaigns()
    own_and_earlier.candidates = [*own.candidates]
    for point in POINTS[1::3]:
        own_and_earlier.add("a", point, shape=(1024, 1024))
    twice = [
        [
            p.key
            for p in TemplateSearch([SPACE], seed=7).propose(
                own_and_earlier.candidates, 4, 2, taken, campaign_id="b"
            )
        ]
        for _ in range(2)
    ]
    assert twice[0] == twice[1]


def test_nearer_campaigns_count_more() -> None:
    assert shape_similarity((256, 4096), (256, 4096)) == 1.0
    assert shape_similarity((1024, 4096), (4096, 1024)) == 0.25
    assert shape_similarity(None, (1, 2)) == 0.5
    campaigns = Campaigns()
    x, y = POINTS[0], POINTS[1]
    # at the same shape, x is best; at a far shape, y is; y's campaign is timed elsewhere
    campaigns.add("near", x, speedup=2.0, shape=(2048, 512))
    campaigns.add("near", y, speedup=1.0, shape=(2048, 512))
    campaigns.add("far", y, speedup=2.0, shape=(64, 64), device="other")
    campaigns.add("far", x, speedup=0.5, shape=(64, 64), device="other")
    campaigns.add("b", POINTS[5], speedup=1.0, shape=(2048, 512))  # timed here, on vm
    prior = prior_of(campaigns.candidates, "b", None)
    assert [o.candidate.proposal.campaign_id for o in prior.outcomes] == ["far"] * 2 + ["near"] * 2
    far, near = prior.outcomes[0].weight, prior.outcomes[-1].weight
    assert near == 1.0 and far == shape_similarity((64, 64), (2048, 512)) * 0.5
    assert next(key for key, _ in prior.ranked(0.0)) == param_key("toy", x)


def test_a_campaign_after_the_recorded_one_starts_from_its_best_points() -> None:
    """The recorded two-generation softmax campaign, then a new campaign of softmax at
    another shape: its generation 0 proposes the recorded campaign's best points first."""
    log = read_log("softmax-two-generations.jsonl")
    history = History()
    for position, event in enumerate(log, 1):
        history.apply(position, event)
    recorded = history.campaign_candidates("recorded")
    speeds = relative_speeds(recorded)  # 1 for the fastest
    near = sorted(
        (c for c in recorded if speeds.get(c.candidate_id, 0.0) >= PRIOR_FLOOR),
        key=lambda c: -speeds[c.candidate_id],
    )
    assert near, "the recorded campaign timed kernels"
    started: Event = new_event(
        CampaignStarted,
        campaign_id="warm",
        actor=ActorRef("cli", "cli-0", "test"),
        name="warm",
        problem="softmax",
        target="cpu",
        config=CampaignSpec(problem="softmax", target="cpu", shapes=[[512, 2048]]).to_config(),
    )
    started = type(started)(
        **{
            **{f: getattr(started, f) for f in started.__struct_fields__},
            "ts": log[-1].ts + timedelta(hours=1),
        }
    )
    history.apply(len(log) + 1, started)
    out = Reactions(started, ActorRef("planner", "planner-0", "test"))
    decide_planner(
        history, started, out, now=started.ts, spaces=design_spaces("softmax", "cpu", "fp32")
    )
    proposed = [e for e in out.events if isinstance(e, CandidateProposed)]
    # the recorded points, completed with the parameters added since at the values that
    # render them as they were (`Param.before`)
    softmax = TEMPLATES["softmax_rows"]
    assert [p.param_key for p in proposed[: len(near)]] == [
        param_key(c.proposal.template, softmax.completed(c.proposal.params)) for c in near
    ]
    # the same history, decided again (a resumed planner), proposes the same
    again = Reactions(started, ActorRef("planner", "planner-1", "test"))
    decide_planner(
        history, started, again, now=started.ts, spaces=design_spaces("softmax", "cpu", "fp32")
    )
    assert [e.param_key for e in again.events if isinstance(e, CandidateProposed)] == [
        p.param_key for p in proposed
    ]


def test_a_kernel_counts_by_its_speed_not_by_its_runs_baseline() -> None:
    """y is twice as fast as x, but x's run met a slow baseline (its pages were fresh, the
    host was busy): x's speedup is the higher. Both the prior and the campaign's own study
    go by speed."""
    x, y = POINTS[0], POINTS[1]
    campaigns = Campaigns()
    for campaign in ("earlier", "b"):
        campaigns.add(campaign, x, speedup=3.0, median_ns=2e6)
        campaigns.add(campaign, y, speedup=2.0, median_ns=1e6)
    campaigns.add("b", POINTS[2], rejected_at="compare")

    prior = prior_of(campaigns.candidates, "b", None)
    assert [key for key, _ in prior.ranked(0.0)] == [param_key("toy", y), param_key("toy", x)]
    assert [o.quality for o in prior.outcomes] == [0.5, 1.0]

    study = TemplateSearch([SPACE], seed=3)._study(campaigns.candidates, 1, prior, "b")
    told = [(t.params["toy.a"], t.params["toy.b"], t.value) for t in study.trials]
    earlier = [(x["a"], x["b"], 0.5), (y["a"], y["b"], 1.0)]  # then this campaign's own
    assert told == [*earlier, *earlier, (POINTS[2]["a"], POINTS[2]["b"], 0.0)]
