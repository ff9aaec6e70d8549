"""Several operators in one child: edits that pay only together, as one move.

Some edits pay only together: `omp simd` on a loop that calls libm's expf stays scalar,
and the template maths of `approx_math` is slower than libm's scalar calls until its loop
is vectorised. A search that applies one operator at a time sees each of them as a loss,
and may never put them together. `chain` applies a sequence of the other operators, each
at a fixed point, each to the child of the one before; a step that refuses (its
precondition does not hold on the kernel so far: the loops are parallel already, no libm
call is left...) is passed over, so a chain also applies to a kernel that has some of its
steps. The child's lineage records the chain as one step, with its point; its diff is
against the parent.

The sequences are those that pay from plain seeds (tests/test_source_operators_verified.py
puts each through the verifier): threads, simd with selects for max and min, the template
maths, `restrict` with 64-byte alignment, -O3 -march=native.

Parameters: steps (the sequence: a key of `SEQUENCES`), accuracy (approx_math's).
Refusals: no_step (no step applies to the parent).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from actors.search.operators.approx_math import ApproxMath
from actors.search.operators.compiler_flags import CompilerFlags
from actors.search.operators.helpers import LEVELS
from actors.search.operators.hoist import Hoist
from actors.search.operators.omp_parallel import OmpParallel
from actors.search.operators.omp_simd import OmpSimd
from actors.search.operators.protocol import (
    Context,
    Params,
    ParamSpace,
    ParentKernel,
    Refusal,
    Variation,
    VariationOperator,
    variation,
)
from actors.search.operators.restrict import Restrict
from kernels.design_space import ParamValue

Link = tuple[VariationOperator, dict[str, ParamValue]]
_THREADS: Link = (OmpParallel(), {})
_SIMD: Link = (OmpSimd(), {"minmax": "select"})
_MATH: Link = (ApproxMath(), {})  # at the chain's accuracy
_HOIST: Link = (Hoist(), {})
_RESTRICT: Link = (Restrict(), {"align": 64})
_FLAGS: Link = (CompilerFlags(), {})
SEQUENCES: dict[str, tuple[Link, ...]] = {
    "threads_simd_math": (_THREADS, _SIMD, _MATH, _RESTRICT, _FLAGS),
    "simd_math": (_SIMD, _MATH, _RESTRICT, _FLAGS),
    "threads_simd_math_hoist": (_THREADS, _SIMD, _MATH, _HOIST, _RESTRICT, _FLAGS),
    "threads_simd": (_THREADS, _SIMD, _RESTRICT, _FLAGS),  # where the maths' error costs
}


class Chain:
    name = "chain"
    arity = 1
    SPACE: ClassVar[ParamSpace] = {"steps": tuple(SEQUENCES), "accuracy": LEVELS[:2]}

    def space(self) -> ParamSpace:
        return dict(self.SPACE)

    def apply(
        self, parents: Sequence[ParentKernel], params: Params, context: Context
    ) -> Variation | Refusal:
        point = {name: values[0] for name, values in self.SPACE.items()} | dict(params)
        bad = [
            f"{k}={v!r}" for k, v in point.items() if k not in self.SPACE or v not in self.SPACE[k]
        ]
        if bad or len(parents) != self.arity:
            return Refusal(self.name, "bad_param", f"not a point of {self.SPACE}: {bad}")
        kernel = parents[0]
        applied = 0
        for operator, fixed in SEQUENCES[str(point["steps"])]:
            step: dict[str, ParamValue] = dict(fixed)
            if operator.name == "approx_math":
                step["accuracy"] = point["accuracy"]
            child = operator.apply([kernel], step, context)
            if isinstance(child, Refusal):
                continue  # its precondition does not hold on the kernel so far
            kernel = child.as_parent(kernel.candidate_id)
            applied += 1
        if applied == 0:
            return Refusal(self.name, "no_step", "no step of the chain applies to the parent")
        return variation(self.name, parents, point, kernel.source, kernel.flags)
