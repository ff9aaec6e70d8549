"""Replace libm calls by vectorisable approximations of a chosen accuracy.

`expf`, `logf`, `log1pf`, `tanhf`, `erff` and `sqrtf` (and `1 / sqrtf(x)`, as one
reciprocal square root), and their double twins (`exp`, ...: computed in float, which the
verifier judges like any other edit), in the source's functions become the helpers of the
project's template maths (`kernels/cpu_templates/_approx_math.c.j2`, via `helpers.py`),
inserted once before the kernel: plain C with selects and no calls, which the compiler
vectorises in omp simd loops where glibc's libm calls keep a loop scalar. Only the called
function's name is edited (or the `1 / sqrtf(...)` expression), so the rest of the line
survives. The child is built with -fno-trapping-math, without which GCC will not
if-convert the helpers' selects.

Parameters: function ("all" or one of the six, each with its double twin), accuracy
("full", "medium", "low": see `helpers._MATH`). Refusals: no_call (none of the chosen
functions is called), too_coarse (a chosen level's error bound, `helpers.ERROR_BOUND`, is
beyond the problem's rtol: the verifier would reject the child), name_taken.
"""

from __future__ import annotations

from typing import ClassVar

from actors.search.operators.base import Change, Job, SourceOperator, with_flags
from actors.search.operators.c_ast import Edit, named_descendants
from actors.search.operators.helpers import (
    LEVELS,
    error_bound,
    insert_helpers,
    is_helper,
    math_name,
)
from actors.search.operators.protocol import ParamSpace, Refuse

FUNCTIONS = {
    "expf": "exp",
    "logf": "log",
    "log1pf": "log1p",
    "tanhf": "tanh",
    "erff": "erf",
    "sqrtf": "sqrt",
}
NO_TRAPPING = "-fno-trapping-math"


class ApproxMath(SourceOperator):
    name = "approx_math"
    SPACE: ClassVar[ParamSpace] = {"function": ("all", *FUNCTIONS), "accuracy": LEVELS}

    def change(self, job: Job) -> Change:
        src, params = job.src, job.params
        picked = list(FUNCTIONS) if params["function"] == "all" else [str(params["function"])]
        chosen = {name: FUNCTIONS[name] for name in picked} | {
            name.removesuffix("f"): FUNCTIONS[name] for name in picked
        }
        level = str(params["accuracy"])
        edits: list[Edit] = []
        used: list[str] = []
        for name, fn in src.functions().items():
            if is_helper(name):
                continue
            for call in named_descendants(fn, "call_expression"):
                callee = call.child_by_field_name("function")
                if callee is None or src.text(callee) not in chosen:
                    continue
                kind = chosen[src.text(callee)]
                parent = call.parent
                if kind == "sqrt" and parent is not None and parent.type == "binary_expression":
                    left, right = (
                        parent.child_by_field_name("left"),
                        parent.child_by_field_name("right"),
                    )
                    operator = parent.child_by_field_name("operator")
                    divides = operator is not None and src.text(operator) == "/"
                    if divides and right is not None and right.id == call.id and src.is_one(left):
                        args = call.child_by_field_name("arguments")
                        assert args is not None
                        helper = math_name("rsqrt", level)
                        edits.append(
                            Edit(parent.start_byte, parent.end_byte, helper + src.text(args))
                        )
                        used.append(helper)
                        continue
                helper = math_name(kind, level)
                edits.append(Edit(callee.start_byte, callee.end_byte, helper))
                used.append(helper)
        if not edits:
            wanted = ", ".join(sorted(picked))
            raise Refuse("no_call", f"the source calls none of {wanted}")
        rtol = job.context.rtol
        coarse = sorted({n for n in used if rtol is not None and error_bound(n, level) > rtol})
        if coarse:
            raise Refuse(
                "too_coarse", f"{', '.join(coarse)} err beyond the problem's rtol {rtol:g}"
            )
        edits += insert_helpers(src, used)
        return Change(tuple(edits), with_flags(job.flags, add=[NO_TRAPPING]))
