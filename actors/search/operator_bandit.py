"""Which variation operator to try next: a UCB1 bandit over what each operator earned.

An operator's arm is paid by each child it wrote in the dedupe scope (the problem, target
and dtype: this campaign and the earlier campaigns of the same problem, so a second
campaign starts from what paid before): `log(parent median / child median)` for a timed
child whose parent was timed, `REJECTED_PENALTY` for a child the compile, static, run or
benchmark stage rejected (an operator that breaks kernels is risky), 0 for a refusal (the
write stage), a duplicate or a child that could not be compared. A child still in flight
counts as a pull at its operator's mean, so one generation spreads over the arms instead
of giving every slot to the same one; `Bandit.pull` does the same for the slots a
strategy fills before anything is settled. The arm with the highest upper bound goes
first; an untried arm's is `UNTRIED` (optimistic, so each is tried once unless one has
earned more than that), and ties go to the earlier arm in `PREFERENCE` (first `chain`,
the edits that pay together from plain seeds, then each of them alone: threads, simd,
fast maths...). Deterministic: no randomness of its own.

The other problems of the problem's family (`actors.search.problem_family`) give each arm
a prior (`family_prior`): what the operator lessons' tallies (`actors.search.operator_tally`)
say its children there earned, the log gain of each timed one and `REJECTED_PENALTY` for
each rejected one, each counting as `PRIOR_WEIGHT` of a pull. A first campaign on a new
problem of a family already searched so starts from what paid there, and its own
children soon outweigh the record.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from actors.campaign.history import Candidate, History
from actors.search.lesson_stats import Moments
from actors.search.lineage import is_operator_proposal
from actors.search.operator_tally import OperatorBook, log_ratio

PREFERENCE = (
    "agent",  # only where the campaign's writer has an endpoint: tried first there
    "chain",
    "omp_parallel",
    "omp_simd",
    "approx_math",
    "restrict",
    "compiler_flags",
    "template",
    "unroll",
    "hoist",
    "fuse",
    "tile",
    "crossover",
    "nontemporal",
)
"""Arms in the order they are first tried (and ties are broken)."""
REJECTED_PENALTY = -0.5
"""A rejected child's reward: about what a child 1.6x slower than its parent earns."""
UNTRIED = 1.0
"""An untried arm's upper bound: optimistic (a child e = 2.7x faster than its parent), so
every arm is tried before the known ones are exploited, unless one earned more than that
(here or in an earlier campaign of the problem)."""
EXPLORATION = 0.5
"""UCB1's exploration weight, for rewards that are log speedups (mostly within +-2)."""
PRIOR_WEIGHT = 0.25
"""What a child of another problem of the family counts for: a quarter of a pull, as the
same edit pays less surely on another operation than on this one."""


def reward(history: History, child: Candidate) -> float | None:
    """What the child paid its operator; None while it is in flight."""
    if child.benchmark is not None:
        gained = log_ratio(history, child)
        return 0.0 if gained is None else gained
    if child.rejected is not None:
        return 0.0 if child.rejected.stage == "write" else REJECTED_PENALTY
    if child.duplicate is not None or child.dead_letter is not None:
        return 0.0
    return None


@dataclass(frozen=True)
class Prior:
    """What an arm earned on the family's other problems, down-weighted."""

    pulls: float
    total: float


def family_prior(history: History, problem: str, target: str, dtype: str) -> dict[str, Prior]:
    """Per operator, what its children on the other problems of this problem's family
    earned, each as `PRIOR_WEIGHT` of a pull (none while the family is not known)."""
    book = OperatorBook.of(history)
    scope = (problem, target, dtype)
    family = book.family(scope)
    if family is None:
        return {}
    prior = {}
    for (operator, name, _), outcomes in book.arms(family, besides=scope).items():
        timed = Moments.merged(t.ratios for t in outcomes.timed.values())
        pulls = timed.n + outcomes.rejected
        if name or pulls == 0:
            continue  # the operator's own arm only
        earned = timed.n * timed.mean + REJECTED_PENALTY * outcomes.rejected
        prior[operator] = Prior(PRIOR_WEIGHT * pulls, PRIOR_WEIGHT * earned)
    return prior


@dataclass
class Arm:
    pulls: int = 0
    total: float = 0.0
    pending: int = 0
    """Pulls whose reward is not known yet (in flight, or chosen in this generation)."""
    prior: Prior = Prior(0.0, 0.0)

    @property
    def weight(self) -> float:
        """Pulls of every kind: settled, pending and the prior's."""
        return self.pulls + self.pending + self.prior.pulls

    @property
    def mean(self) -> float:
        pulls = self.pulls + self.prior.pulls
        return (self.total + self.prior.total) / pulls if pulls else 0.0


@dataclass
class Bandit:
    arms: dict[str, Arm] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        history: History,
        scope: Iterable[Candidate],
        operators: Sequence[str],
        prior: Mapping[str, Prior] | None = None,
    ) -> Bandit:
        """The arms of `operators`, paid by the operator children in `scope`, each starting
        from its `prior` (`family_prior`) where it has one."""
        known = prior or {}
        bandit = cls({name: Arm(prior=known.get(name, Prior(0.0, 0.0))) for name in operators})
        for candidate in scope:
            arm = bandit.arms.get(candidate.proposal.operator)
            if arm is None or not is_operator_proposal(candidate):
                continue
            earned = reward(history, candidate)
            if earned is None:
                arm.pending += 1
            else:
                arm.pulls += 1
                arm.total += earned
        return bandit

    def choose(self, allowed: Iterable[str]) -> str | None:
        """The arm to pull among `allowed`: the highest upper bound (`UNTRIED` for an arm
        never pulled), ties to the earlier in `PREFERENCE`."""
        ranked = self.ranked(allowed)
        return ranked[0] if ranked else None

    def ranked(self, allowed: Iterable[str]) -> list[str]:
        """`allowed`, the arm `choose` would pull first, then the next..."""
        names = [n for n in self._ordered() if n in set(allowed)]
        total = sum(a.weight for a in self.arms.values())
        return sorted(names, key=lambda n: (-self._bound(self.arms[n], total), names.index(n)))

    def pull(self, name: str) -> None:
        """Count a pull whose reward is not known yet."""
        self.arms[name].pending += 1

    def _bound(self, arm: Arm, total: float) -> float:
        n = arm.weight
        if n == 0:
            return UNTRIED
        return arm.mean + EXPLORATION * math.sqrt(2 * math.log(max(total, 1)) / n)

    def _ordered(self) -> list[str]:
        rank = {name: i for i, name in enumerate(PREFERENCE)}
        return sorted(self.arms, key=lambda n: (rank.get(n, len(rank)), n))

    def summary(self) -> dict[str, tuple[int, float]]:
        """Each arm's settled pulls and mean reward."""
        return {name: (arm.pulls, arm.mean) for name, arm in self.arms.items()}
