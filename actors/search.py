"""Template-mode search: an optuna ask/tell study over a problem's design spaces,
rebuilt from the replayed history at every generation.

Every settled candidate of the same problem and target (this campaign and earlier ones)
is added to a fresh study as a finished trial: its value is the measured speedup, 0 for
a rejected kernel, so TPE learns to leave failing regions. Points that break a space's
constraints, were already proposed in the dedupe scope, or fall in a region a lesson
says to avoid are told as pruned and never proposed.
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

from actors.history import Candidate, param_key

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

TEMPLATE = "template"


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

    def _study(self, history: Sequence[Candidate], generation: int) -> optuna.Study:
        sampler = optuna.samplers.TPESampler(
            seed=self.seed * 1_000_003 + generation,
            n_startup_trials=8,
            multivariate=True,
            group=True,
            constant_liar=True,
        )
        study = optuna.create_study(direction="maximize", sampler=sampler)
        for candidate in history:
            template = candidate.proposal.template
            if template not in self.spaces or not candidate.settled or candidate.duplicate:
                continue
            given = candidate.proposal.params
            space = self.spaces[template].params
            if set(given) != {p.name for p in space} or any(
                given[p.name] not in p.choices for p in space
            ):
                continue  # the space changed since; that point cannot inform this study
            distributions = self._distributions(template)
            params: dict[str, Any] = {TEMPLATE: template}
            params |= {f"{template}.{k}": v for k, v in given.items()}
            study.add_trial(
                create_trial(
                    params=params, distributions=distributions, value=candidate.speedup or 0.0
                )
            )
        return study

    def propose(
        self,
        history: Sequence[Candidate],
        count: int,
        generation: int,
        taken: Callable[[Proposal], bool],
    ) -> list[Proposal]:
        """Up to `count` new valid points; `taken` says a point is seen or to be avoided."""
        study = self._study(history, generation)
        chosen: dict[str, Proposal] = {}
        for _ in range(40 * count):
            if len(chosen) == count:
                break
            trial = study.ask()
            template = str(trial.suggest_categorical(TEMPLATE, list(self.spaces)))
            params = {
                p.name: trial.suggest_categorical(f"{template}.{p.name}", list(p.choices))
                for p in self.spaces[template].params
            }
            proposal = Proposal(template, params)
            if (
                not self.spaces[template].is_valid(params)
                or proposal.key in chosen
                or taken(proposal)
            ):
                study.tell(trial, state=TrialState.PRUNED)
                continue
            chosen[proposal.key] = proposal  # left running: the constant liar spreads the rest
        if len(chosen) < count:
            self._fill_randomly(chosen, count, generation, taken)
        return list(chosen.values())

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
            params = {p.name: rng.choice(list(p.choices)) for p in space.params}
            proposal = Proposal(space.name, params)
            if space.is_valid(params) and proposal.key not in chosen and not taken(proposal):
                chosen[proposal.key] = proposal
