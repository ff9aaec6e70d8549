"""Template-mode search: an optuna ask/tell study over a problem's design spaces,
rebuilt from the replayed history at every generation.

Every settled candidate of the same problem and target (this campaign and earlier ones)
is added to a fresh study as a finished trial: its value is its speed relative to the
fastest kernel timed at its shape (`actors.campaign.ranking.relative_speeds`: not its
speedup, which also divides by one run's baseline), 0 for a rejected kernel, so TPE learns
to leave failing regions. Points that break a space's constraints, were already proposed
in the dedupe scope, or fall in a region a lesson says to avoid are told as pruned and
never proposed. A point first takes the values its structures fix (`Template.canonical`):
a structure that ignores some parameters is proposed as often as any other, not pruned
for what it ignores.

A generation is asked of one study (multivariate TPE, seeded by the search seed and the
generation) with the constant liar: each point asked is left running, so TPE treats it
as a poor outcome and spreads the generation's other points away from it instead of
proposing near-copies. When TPE keeps suggesting known points, the rest of the
generation is sampled uniformly from the spaces (`_fill_randomly`).

What earlier campaigns measured (other shapes, other hosts) is a prior (`actors.search.priors`):
- their outcomes enter the study as speeds relative to each campaign's own fastest, least
  similar campaign first, so TPE's weighting of older trials counts them least; this
  campaign's own follow, relative to its fastest;
- until this campaign has timed a kernel, its generation starts with the points earlier
  campaigns found within `PRIOR_FLOOR` of their fastest, fastest first (enqueued in the
  study);
- a point an earlier campaign rejected as a wrong kernel is never proposed.
With no earlier campaign the study is the one described first, and costs nothing more.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState, create_trial

from actors.campaign.history import Candidate, param_key
from actors.campaign.ranking import relative_speeds
from actors.search.priors import Prior, prior_of

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

TEMPLATE = "template"
PRIOR_FLOOR = 0.9
"""A warm start first proposes earlier points at least this close to their campaign's best."""


class ParamSpec(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def choices(self) -> tuple[Any, ...]: ...


class Space(Protocol):
    """What the search needs of a design space (a kernel template or a fusion space)."""

    @property
    def name(self) -> str: ...
    @property
    def params(self) -> Sequence[ParamSpec]: ...
    def is_valid(self, params: Any) -> bool: ...
    def canonical(self, params: Any) -> dict[str, Any]: ...
    def completed(self, params: Any) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Proposal:
    template: str
    params: dict[str, Any]

    @property
    def key(self) -> str:
        return param_key(self.template, self.params)


class TemplateSearch:
    def __init__(self, spaces: Sequence[Space], seed: int) -> None:
        if not spaces:
            raise ValueError("no design space to search")
        self.spaces = {space.name: space for space in spaces}
        self.seed = seed

    def _distributions(self, template: str) -> dict[str, BaseDistribution]:
        found: dict[str, BaseDistribution] = {TEMPLATE: CategoricalDistribution(list(self.spaces))}
        for p in self.spaces[template].params:
            found[f"{template}.{p.name}"] = CategoricalDistribution(list(p.choices))
        return found

    def _trial_params(self, template: str, given: dict[str, Any]) -> dict[str, Any] | None:
        """The study's names for a point of `template` (one recorded before a parameter
        existed takes its `before` value), or None when the space no longer holds it (it
        changed since; that point cannot inform this study)."""
        if template not in self.spaces:
            return None
        given = self.spaces[template].completed(given)
        space = self.spaces[template].params
        if set(given) != {p.name for p in space} or any(
            given[p.name] not in p.choices for p in space
        ):
            return None
        return {TEMPLATE: template} | {f"{template}.{k}": v for k, v in given.items()}

    def _tell(self, study: optuna.Study, candidate: Candidate, value: float) -> None:
        params = self._trial_params(candidate.proposal.template, candidate.proposal.params)
        if params is None:
            return
        distributions = self._distributions(candidate.proposal.template)
        study.add_trial(create_trial(params=params, distributions=distributions, value=value))

    def _study(
        self, history: Sequence[Candidate], generation: int, prior: Prior, campaign_id: str | None
    ) -> optuna.Study:
        sampler = optuna.samplers.TPESampler(
            seed=self.seed * 1_000_003 + generation,
            n_startup_trials=8,
            multivariate=True,
            group=True,
            constant_liar=True,
        )
        study = optuna.create_study(direction="maximize", sampler=sampler)
        settled = [c for c in history if c.settled and not c.duplicate]
        if not prior.empty:
            for outcome in prior.outcomes:
                self._tell(study, outcome.candidate, outcome.quality)
            settled = [c for c in settled if c.proposal.campaign_id == campaign_id]
        speeds = relative_speeds(settled)
        for candidate in settled:
            self._tell(study, candidate, speeds.get(candidate.candidate_id, 0.0))
        return study

    def propose(
        self,
        history: Sequence[Candidate],
        count: int,
        generation: int,
        taken: Callable[[Proposal], bool],
        *,
        campaign_id: str | None = None,
        shape: Sequence[int] | None = None,
    ) -> list[Proposal]:
        """Up to `count` new valid points; `taken` says a point is seen or to be avoided.
        With `campaign_id`, the history's other campaigns are its prior (`shape`: the
        extents this campaign times at, for the first generation)."""
        prior = prior_of(history, campaign_id, shape) if campaign_id else Prior([])
        refused = prior.refused()

        def unwanted(proposal: Proposal) -> bool:
            return proposal.key in refused or taken(proposal)

        study = self._study(history, generation, prior, campaign_id)
        own_timed = any(
            c.benchmark is not None and c.proposal.campaign_id == campaign_id for c in history
        )
        if not prior.empty and not own_timed:
            for point in self._warm_start(history, prior, count, unwanted):
                study.enqueue_trial(point, skip_if_exists=False)
        chosen: dict[str, Proposal] = {}
        for _ in range(40 * count):
            if len(chosen) == count:
                break
            trial = study.ask()
            template = str(trial.suggest_categorical(TEMPLATE, list(self.spaces)))
            params = self.spaces[template].canonical(
                {
                    p.name: trial.suggest_categorical(f"{template}.{p.name}", list(p.choices))
                    for p in self.spaces[template].params
                }
            )
            proposal = Proposal(template, params)
            if (
                not self.spaces[template].is_valid(params)
                or proposal.key in chosen
                or unwanted(proposal)
            ):
                study.tell(trial, state=TrialState.PRUNED)
                continue
            chosen[proposal.key] = proposal  # left running: the constant liar spreads the rest
        if len(chosen) < count:
            self._fill_randomly(chosen, count, generation, unwanted)
        return list(chosen.values())

    def _warm_start(
        self,
        history: Sequence[Candidate],
        prior: Prior,
        count: int,
        unwanted: Callable[[Proposal], bool],
    ) -> list[dict[str, Any]]:
        """The study's parameters of up to `count` of the prior's best points that this
        campaign may still propose, best first."""
        points = {o.candidate.proposal.param_key: o.candidate.proposal for o in prior.outcomes}
        found: list[dict[str, Any]] = []
        for key, _score in prior.ranked(PRIOR_FLOOR):
            if len(found) == count:
                break
            proposed = points[key]
            params = self._trial_params(proposed.template, proposed.params)
            if params is None:
                continue
            proposal = Proposal(
                proposed.template, self.spaces[proposed.template].completed(proposed.params)
            )
            if not self.spaces[proposal.template].is_valid(proposal.params) or unwanted(proposal):
                continue
            found.append(params)
        return found

    def _fill_randomly(
        self,
        chosen: dict[str, Proposal],
        count: int,
        generation: int,
        taken: Callable[[Proposal], bool],
    ) -> None:
        """When TPE keeps suggesting known points, sample the rest of the space uniformly."""
        rng = random.Random(self.seed * 7919 + generation)
        for _ in range(200 * count):
            if len(chosen) == count:
                return
            space = self.spaces[rng.choice(list(self.spaces))]
            params = space.canonical({p.name: rng.choice(list(p.choices)) for p in space.params})
            proposal = Proposal(space.name, params)
            if space.is_valid(params) and proposal.key not in chosen and not taken(proposal):
                chosen[proposal.key] = proposal
