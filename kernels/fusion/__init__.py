"""Fusion of graph problems: an op IR, its partitions, and C / CUDA code generated from it.

Public API:

- `graph_of(problem)`: the IR of a graph problem (`ir.Graph`), from `Problem.graph`;
- `partitions(op_names)`: every contiguous grouping of the chain (`Partition`, `.key`);
- `fusion_space(problem, target)`: the design space (a `Template`) a planner searches;
- `plan(problem, partition, params, target)`: one rendered `FusionPlan`;
- `unfused_chain(problem)`: the unfused numpy chain, op by op, from the IR.
"""

from kernels.fusion.ir import Graph, NotAGraphProblem, evaluate, graph_of, unfused_chain
from kernels.fusion.partitions import Partition, parse_partition, partitions
from kernels.fusion.plan import FusionPlan, best_known_for, fusion_space, param_key, plan
from kernels.fusion.space import FusionSpace

__all__ = [
    "FusionPlan",
    "FusionSpace",
    "Graph",
    "NotAGraphProblem",
    "Partition",
    "best_known_for",
    "evaluate",
    "fusion_space",
    "graph_of",
    "param_key",
    "parse_partition",
    "partitions",
    "plan",
    "unfused_chain",
]
