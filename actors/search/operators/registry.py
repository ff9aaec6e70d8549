"""The variation operators by name: what the planner searches and the kernel writer applies.

Each is a `VariationOperator`: its `space()` (name -> values, first the default) is searched
like a template's, and `apply(parents, params, context)` gives a `Variation` or a `Refusal`.
`crossover` takes two parents, the others one; `chain` applies several of the others in one
child; `template` moves a template kernel's point (templates are one operator among the
others).

`AGENT` is the one operator that is not offline: an LLM agent (`actors.search.agent`),
offered only where the campaign's writer has an endpoint (`searched`). It is asynchronous
(`protocol.AsyncVariationOperator`), so the planner only names it and the kernel writer
runs it.
"""

from __future__ import annotations

from actors.search.operators.approx_math import ApproxMath
from actors.search.operators.chain import Chain
from actors.search.operators.compiler_flags import CompilerFlags
from actors.search.operators.crossover import Crossover
from actors.search.operators.fuse import Fuse
from actors.search.operators.hoist import Hoist
from actors.search.operators.nontemporal import Nontemporal
from actors.search.operators.omp_parallel import OmpParallel
from actors.search.operators.omp_simd import OmpSimd
from actors.search.operators.protocol import ParamSpace, Searched, VariationOperator
from actors.search.operators.restrict import Restrict
from actors.search.operators.template_point import TemplateStep
from actors.search.operators.tile import Tile
from actors.search.operators.unroll import Unroll

OPERATORS: dict[str, VariationOperator] = {
    op.name: op
    for op in (
        OmpParallel(),
        OmpSimd(),
        Unroll(),
        Restrict(),
        Hoist(),
        ApproxMath(),
        Tile(),
        Fuse(),
        Nontemporal(),
        CompilerFlags(),
        Crossover(),
        Chain(),
        TemplateStep(),
    )
}

AGENT = "agent"
AGENT_SPACE: ParamSpace = {"attempt": (0, 1, 2, 3)}
"""The agent's one parameter: which of up to four variations of the same parent this is."""


class AgentSearched:
    """The agent as the planner knows it: one parent, `AGENT_SPACE`."""

    name = AGENT
    arity = 1

    def space(self) -> ParamSpace:
        return dict(AGENT_SPACE)


def searched(with_agent: bool) -> dict[str, Searched]:
    """The operators a campaign's search chooses among: the offline ones, and the agent
    where the campaign's writer has an endpoint."""
    found: dict[str, Searched] = dict(OPERATORS)
    if with_agent:
        found[AGENT] = AgentSearched()
    return found
