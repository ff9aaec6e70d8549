"""The design spaces a planner searches for a problem and target."""

from __future__ import annotations

from collections.abc import Sequence

from actors.search import Space
from kernels.templates import templates_for


def design_spaces(problem: str, target: str) -> Sequence[Space]:
    return templates_for(problem, target)
