"""The fused design space: a `Template` whose source is generated from the IR.

A `FusionSpace` is a `kernels.design_space.Template` (same params, constraints, defaults,
`valid_points()`, `violations()`, `render()`), so a planner searches partitions and
code-generation parameters exactly as it searches template spaces. Its `file` is empty:
its `generate` calls the code generator instead of rendering a jinja file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kernels.design_space import Params, Rendered, Template
from kernels.fusion.ir import Graph

FUSION_SPACE_NAME = "fusion"
"""The name of every fusion space: a problem and target have exactly one."""


@dataclass(frozen=True)
class FusionSpace(Template):
    graph: Graph
    generator: Callable[[Params, str], Rendered]
    """Renders an assignment and dtype that `render` has checked."""

    def generate(self, params: Params, dtype: str) -> Rendered:
        return self.generator(params, dtype)
