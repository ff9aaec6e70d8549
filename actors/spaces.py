"""The design spaces a planner searches for a problem and target."""

from __future__ import annotations

from collections.abc import Sequence

from actors.search import Space
from kernels.fusion.plan import fusion_space
from kernels.loading import load_problem
from kernels.templates import templates_for


def design_spaces(problem: str, target: str, dtype: str = "fp32") -> Sequence[Space]:
    """The problem's templates written for `dtype`, plus the fusion space for graph problems."""
    spaces: list[Space] = [t for t in templates_for(problem, target) if t.accepts(dtype)]
    if load_problem(problem).graph:
        fused = fusion_space(problem, target)
        if fused.accepts(dtype):
            spaces.append(fused)
    return spaces
