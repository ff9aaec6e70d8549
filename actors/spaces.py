"""The design spaces a planner searches for a problem and target."""

from __future__ import annotations

from collections.abc import Sequence

from actors.search import Space
from kernels.fusion.plan import fusion_space
from kernels.loading import load_problem
from kernels.templates import templates_for


def design_spaces(problem: str, target: str) -> Sequence[Space]:
    """The problem's templates, plus the fusion space for graph problems."""
    spaces: list[Space] = list(templates_for(problem, target))
    if load_problem(problem).graph:
        spaces.append(fusion_space(problem, target))
    return spaces
