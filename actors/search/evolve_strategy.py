"""The evolve strategy (`writer.kind = "evolve"`): offline variation operators on C source
(`actors.search.operators`), chosen by what they earned.

Generation 0 is the seed kernels as they are (`[seed] sources`, `--seed-source`). Only
when there is no seed does it start from the problem's templates at their best known
points: a user's kernel is improved from itself, so what the operators earned is not
mixed with what a template's author wrote. Each later generation varies the campaign's
best verified and timed kernels (the first `PARENTS` leaderboard rows). Each slot first
varies the best kernel with an operator never applied to it, at the operator's defaults,
taking the operators in the bandit's (`actors.search.operator_bandit`) order: a new best
is tried with every operator, since what paid on its ancestors may pay again and some pay
only after others (fast maths after simd), which a bandit alone would learn too late.
When every operator has been applied to the best, the bandit picks an operator, a parent
is drawn (the better the likelier; a crossover takes the best and another of distinct
source), and the operator's parameters are drawn from its `space()` (its defaults on the
first try of an operator in a slot), all from a generator seeded by the campaign's seed,
the generation and the slot. The operator is applied here first, as the kernel writer
will apply it: a point it refuses, a (parent source, operator, params) already proposed in
the dedupe scope (its `param_key`) or a child whose exact kernel the scope already holds
is never proposed; the slot tries again, up to `TRIES` times, and then every operator at
every point on each of the first `2 * PARENTS` rows in turn, so that a generation is
filled while a new child is left (the campaign ends at its first empty generation). The
bandit learns from every campaign of the problem, target and dtype; what counts as
proposed is the dedupe scope's (the same shapes too: at another shape the same edit is
worth timing again). Where the campaign's writer has an endpoint (`base_url` and
`model`) the LLM agent (`agent`, `actors.search.agent`) is one more arm; it cannot be
tried here (it needs the endpoint and the sandbox), so any (parent, agent, attempt) not
proposed before is. A pure function of the history.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

from actors.campaign.campaign_file import CampaignSpec
from actors.campaign.history import Campaign, Candidate, History, param_key
from actors.campaign.leaderboard import campaign_leaderboard
from actors.search.lineage import EVOLVE_TEMPLATE, context_for, parent_kernel
from actors.search.operator_bandit import Bandit, family_prior
from actors.search.operators.protocol import Context, ParentKernel, Refusal, Searched
from actors.search.operators.registry import OPERATORS, searched
from actors.search.spaces import kernel_templates, seed_points
from actors.search.strategy import Filled, GenerationInputs, Planned, Stalled, fresh_points
from actors.search.template_search import Proposal, Space
from kernels.design_space import ParamValue
from kernels.identity import source_hash

PARENTS = 4
"""How many of the campaign's best kernels a generation varies."""
TRIES = 24
"""Draws per slot before every point is tried in turn."""
APPLICATIONS = 240
"""Operator applications per slot, when every point is tried in turn, before it is left
empty."""
NOTHING_TO_START = (
    "writer.kind = 'evolve' starts from a kernel: give a seed ([seed] sources or "
    "--seed-source), or a problem with templates"
)


class EvolveStrategy:
    def first_points(self, spec: CampaignSpec) -> list[Proposal]:
        seeds = seed_points(spec)
        if seeds:
            return seeds
        return [
            Proposal(t.name, dict(t.best_known))
            for t in kernel_templates(spec.problem, spec.target, spec)
        ]

    def needs_known(self, generation: int, spaces: Sequence[Space]) -> bool:
        return True  # operator keys are known to the librarian like template points

    def fill(
        self, history: History, campaign: Campaign, generation: int, inputs: GenerationInputs
    ) -> Filled | Stalled:
        if generation == 0:
            if not inputs.first_points:
                return Stalled("no_seed", NOTHING_TO_START)
            points = fresh_points(inputs.first_points, inputs.known, inputs.count)
            return Filled([Planned.point(p) for p in points], "nothing new to start from")
        rows = campaign_leaderboard(history, campaign.started.campaign_id).rows[: 2 * PARENTS]
        parents = [parent_kernel(history, row.candidate) for row in rows]
        pool = [p for p in parents if p is not None]
        if not pool:
            return Filled([], "no verified and timed kernel to vary")
        return Filled(
            _vary(history, campaign, generation, inputs, pool),
            "no operator gives a new child of the best kernels",
        )


def _vary(
    history: History,
    campaign: Campaign,
    generation: int,
    inputs: GenerationInputs,
    pool: list[ParentKernel],
) -> list[Planned]:
    spec = campaign.spec
    problem = history.scope_candidates(spec.problem, spec.target, spec.dtype)
    operators = searched(spec.writer.has_endpoint)
    prior = family_prior(history, spec.problem, spec.target, spec.dtype)
    bandit = Bandit.of(history, problem, list(operators), prior)  # and the family's record
    context = context_for(spec)
    scope = [
        c for c in problem if history.campaigns[c.proposal.campaign_id].scope == campaign.scope
    ]
    hashes = {c.written.source_hash for c in scope if c.written is not None}
    taken = set(inputs.known) | {c.proposal.param_key for c in scope}
    tried = _tried(history, scope)
    chosen: list[Planned] = []
    for slot in range(inputs.count):
        draw = _Draw(bandit, operators, pool[:PARENTS], context, taken, hashes)
        rng = random.Random(_seed(spec.search.seed, generation, slot))
        planned = draw.on_best(tried) or draw.anywhere(rng) or draw.everywhere(rng, pool)
        if planned is None:
            continue
        chosen.append(planned)
        bandit.pull(planned.operator)
        varied = next(p for p in pool if p.candidate_id == planned.parents[0])
        tried.setdefault(_digest(varied), set()).add(planned.operator)
    return chosen


def _tried(history: History, scope: Sequence[Candidate]) -> dict[str, set[str]]:
    """Per kernel (its source hash), the operators a proposal of the scope applied to it."""
    tried: dict[str, set[str]] = {}
    for candidate in scope:
        parents = candidate.proposal.parents
        parent = history.candidates.get(parents[0]) if parents else None
        if parent is not None and parent.written is not None:
            tried.setdefault(parent.written.source_hash, set()).add(candidate.proposal.operator)
    return tried


@dataclass
class _Draw:
    """One slot's search for a new child: a refused point, a key already proposed or a
    child the scope already holds is passed over."""

    bandit: Bandit
    operators: dict[str, Searched]
    pool: list[ParentKernel]
    context: Context
    taken: set[str]
    hashes: set[str]

    def on_best(self, tried: dict[str, set[str]]) -> Planned | None:
        """The best kernel varied by an operator never applied to it, at the operator's
        defaults: the arms in the bandit's order, so each new best is tried with every
        operator (what paid on its ancestors may pay again) before the search wanders."""
        best = self.pool[0]
        done = tried.get(_digest(best), set())
        for name in self.bandit.ranked([n for n in self.operators if n not in done]):
            operator = self.operators[name]
            if not _fits(operator, self.pool):
                continue
            others = [p for p in self.pool[1:] if _digest(p) != _digest(best)]
            parents = [best, *others[: operator.arity - 1]]
            planned = self._try(name, parents, _defaults(operator))
            if isinstance(planned, Planned):
                return planned
        return None

    def anywhere(self, rng: random.Random) -> Planned | None:
        """The bandit's operator on drawn parents at a drawn point, the first that gives a
        new child; None after `TRIES` draws."""
        excluded: set[str] = set()
        tried: dict[str, int] = {}
        for _ in range(TRIES):
            allowed = [
                n
                for n in self.operators
                if n not in excluded and _fits(self.operators[n], self.pool)
            ]
            name = self.bandit.choose(allowed)
            if name is None:
                return None
            operator = self.operators[name]
            parents = _draw_parents(rng, operator, self.pool)
            params = _draw_params(rng, operator, first=tried.get(name, 0) == 0)
            tried[name] = tried.get(name, 0) + 1
            if tried[name] >= 4:
                excluded.add(name)  # others get their turn in this slot
            planned = self._try(name, parents, params)
            if isinstance(planned, Planned):
                return planned
            if planned == "refused":
                excluded.add(name)  # its precondition does not hold on these parents
        return None

    def everywhere(self, rng: random.Random, wide: list[ParentKernel]) -> Planned | None:
        """Each operator at each point of its space on each of `wide` (the better parents
        and the bandit's arms first, the points in a drawn order): the first new child,
        after at most `APPLICATIONS` applications. A generation is filled while a new child
        is left near the best, instead of ending the campaign with its budget unspent."""
        left = APPLICATIONS
        for parent in wide:
            others = [p for p in wide if _digest(p) != _digest(parent)]
            for name in self.bandit.ranked(self.operators):
                operator = self.operators[name]
                if operator.arity - 1 > len(others):
                    continue
                points = [
                    dict(zip(operator.space(), values, strict=True))
                    for values in itertools.product(*operator.space().values())
                ]
                rng.shuffle(points)
                for params in points:
                    if left == 0:
                        return None
                    planned = self._try(name, [parent, *others[: operator.arity - 1]], params)
                    if isinstance(planned, Planned):
                        return planned
                    left -= planned != "taken"
        return None

    def _try(
        self, name: str, parents: list[ParentKernel], params: dict[str, ParamValue]
    ) -> Planned | str:
        """The proposal, or why there is none: "taken", "refused" or "known"."""
        key = _key(name, parents, params)
        if key in self.taken:
            return "taken"
        if name not in OPERATORS:  # the agent: run by the kernel writer
            self.taken.add(key)
            return Planned(EVOLVE_TEMPLATE, dict(params), key, name, [parents[0].candidate_id])
        child = OPERATORS[name].apply(parents, params, self.context)
        if isinstance(child, Refusal):
            return "refused"
        digest = source_hash(child.source, list(child.flags))
        if digest in self.hashes:
            return "known"
        self.taken.add(key)
        self.hashes.add(digest)
        return Planned(EVOLVE_TEMPLATE, dict(params), key, name, [p.candidate_id for p in parents])


def _fits(operator: Searched, pool: list[ParentKernel]) -> bool:
    return operator.arity <= len({(p.source, p.flags) for p in pool})


def _draw_parents(
    rng: random.Random, operator: Searched, pool: list[ParentKernel]
) -> list[ParentKernel]:
    """One parent, the better the likelier; a crossover's two: the best and a different."""
    weights = [1.0 / (rank + 1) for rank in range(len(pool))]
    if operator.arity == 1:
        return [rng.choices(pool, weights)[0]]
    first = pool[0]
    others = [p for p in pool[1:] if (p.source, p.flags) != (first.source, first.flags)]
    return [first, rng.choices(others, weights[: len(others)])[0]]


def _draw_params(rng: random.Random, operator: Searched, first: bool) -> dict[str, ParamValue]:
    if first:
        return _defaults(operator)
    return {name: rng.choice(values) for name, values in sorted(operator.space().items())}


def _defaults(operator: Searched) -> dict[str, ParamValue]:
    return {name: values[0] for name, values in operator.space().items()}


def _digest(kernel: ParentKernel) -> str:
    return source_hash(kernel.source, list(kernel.flags))


def _key(name: str, parents: list[ParentKernel], params: dict[str, ParamValue]) -> str:
    """(parent sources, operator, params): the same edit of the same kernel has one key,
    whichever candidate carried that kernel."""
    sources = "+".join(_digest(p)[:16] for p in parents)
    return param_key(f"{EVOLVE_TEMPLATE}/{name}/{sources}", dict(params))


def _seed(seed: int, generation: int, slot: int) -> int:
    digest = hashlib.sha256(f"evolve:{seed}:{generation}:{slot}".encode()).digest()
    return int.from_bytes(digest[:8], "big")
