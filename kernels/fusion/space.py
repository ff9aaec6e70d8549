"""The fused design space: a `Template` whose source is generated from the IR.

A `FusionSpace` is a `kernels.templates.Template` (same params, constraints, defaults,
`valid_points()`, `violations()`, `render()`), so a planner searches partitions and
code-generation parameters exactly as it searches template spaces. Its `file` is empty:
`render` calls the generator instead of a jinja file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kernels.design_space import InvalidParams, Params, Rendered, Template
from kernels.fusion.ir import Graph
from kernels.fusion.partitions import Partition, parse_partition

FUSION_SPACE_NAME = "fusion"
"""The name of every fusion space: a problem and target have exactly one."""


@dataclass(frozen=True)
class FusionSpace(Template):
    graph: Graph
    generate: Callable[[Params, str], Rendered]
    """Renders a valid assignment for a dtype; `render` checks both first."""

    def render(self, params: Params, dtype: str = "fp32") -> Rendered:
        problems = self.violations(params)
        if not self.accepts(dtype):
            problems.append(f"dtype {dtype!r}: {self.name} is not written for it")
        if problems:
            raise InvalidParams(f"{self.name}: {'; '.join(problems)}")
        return self.generate(params, dtype)

    def partition(self, params: Params) -> Partition:
        return parse_partition(str(params["partition"]), self.graph.op_names)
