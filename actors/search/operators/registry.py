"""The variation operators by name: what the planner searches and the kernel writer applies.

Each is a `VariationOperator`: its `space()` (name -> values, first the default) is searched
like a template's, and `apply(parents, params, context)` gives a `Variation` or a `Refusal`.
`crossover` takes two parents, the others one; `chain` applies several of the others in one
child; `template` moves a template kernel's point (templates are one operator among the
others).
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
from actors.search.operators.protocol import VariationOperator
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
