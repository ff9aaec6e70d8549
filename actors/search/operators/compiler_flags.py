"""Compiler flags: the optimisation level, the host's own instruction set, how strict the
floating-point maths is, and the vector width the compiler prefers.

The child's source is the parent's; its flags are the parent's without the ones this
operator chooses among, plus the chosen ones (so -fopenmp, -D... stay). Every flag is on
the verifier's allow list; -ffast-math is built with -fno-finite-math-only added by the
verifier, so NaN and infinities are still judged. This is `kernels.user_spaces`' generic
space of flags and vector widths, as an operator that composes with the others.

Parameters: opt ("-O3", "-O2"), arch ("native", "generic"), math ("strict", "no-errno":
-fno-math-errno, "no-trapping": and -fno-trapping-math, "fast": -ffast-math),
vector_width (0: the compiler's, 256, 512). A -fno-trapping-math the parent has stays (the
template maths of `approx_math` needs it to vectorise).
Refusals: needs_native (a vector width without -march=native), no_change.
"""

from __future__ import annotations

from typing import ClassVar

from actors.search.operators.base import Change, Job, SourceOperator, with_flags
from actors.search.operators.protocol import ParamSpace, Refuse

MATH_FLAGS = {
    "strict": (),
    "no-errno": ("-fno-math-errno",),
    "no-trapping": ("-fno-math-errno", "-fno-trapping-math"),
    "fast": ("-ffast-math",),
}
_CHOSEN_HERE = ("-O", "-march=", "-mtune=", "-mprefer-vector-width=", "-ffast-math", "-Ofast")
_MATH_WORDS = ("math-errno", "fast-math")


def _chosen_here(flag: str) -> bool:
    return flag.startswith(_CHOSEN_HERE) or any(flag.endswith(w) for w in _MATH_WORDS)


class CompilerFlags(SourceOperator):
    name = "compiler_flags"
    SPACE: ClassVar[ParamSpace] = {
        "opt": ("-O3", "-O2"),
        "arch": ("native", "generic"),
        "math": tuple(MATH_FLAGS),
        "vector_width": (0, 256, 512),
    }

    def change(self, job: Job) -> Change:
        params = job.params
        if params["vector_width"] and params["arch"] != "native":
            raise Refuse("needs_native", "a preferred vector width goes with -march=native")
        kept = [f for f in job.flags if not _chosen_here(f)]
        chosen = [str(params["opt"])]
        if params["arch"] == "native":
            chosen.append("-march=native")
        chosen += MATH_FLAGS[str(params["math"])]
        if params["vector_width"]:
            chosen.append(f"-mprefer-vector-width={params['vector_width']}")
        return Change((), with_flags(chosen, add=kept))
