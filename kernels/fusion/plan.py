"""Fusion plans: what the fuser decides for one candidate, as plain data.

`fusion_space(problem, target)` is the design space a planner searches (partition plus
code-generation parameters; a `Template`). `plan(problem, partition, params, target)`
renders one point of it into a `FusionPlan`: the groups, the normalised parameters and
their key, the source and the compiler flags. Its `event_fields()` are the payload of a
`FusionPlanned` event; its `source` and `flags` are what the kernel writer emits.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kernels.cuda_launch import Launch, parse_launch_plan
from kernels.design_space import TARGET_DTYPES, InvalidParams, ParamValue
from kernels.fusion import codegen_c, codegen_cuda
from kernels.fusion.ir import graph_of
from kernels.fusion.partitions import Partition, parse_partition
from kernels.fusion.space import FusionSpace
from kernels.loading import ProblemLoadError, load_problem
from kernels.spec import Problem

ProblemRef = Problem | str
"""A problem, or its load spec (a built-in name or `path.py:NAME`), as events carry it."""


def _problem(problem: ProblemRef) -> Problem:
    if isinstance(problem, Problem):
        return problem
    try:
        return load_problem(problem)
    except ProblemLoadError as exc:
        raise ValueError(str(exc)) from None


def _called_directly(source: str, problem: Problem) -> tuple[Launch, ...]:
    return ()


def _declared_launches(source: str, problem: Problem) -> tuple[Launch, ...]:
    return parse_launch_plan(source, problem).launches


@dataclass(frozen=True)
class FusionCodegen:
    """A target's code generator of fused chains."""

    space: Callable[[Problem], FusionSpace]
    launches: Callable[[str, Problem], tuple[Launch, ...]]
    """The launches a generated source declares (none: the source is called directly)."""


CODEGENS: dict[str, FusionCodegen] = {
    "cpu": FusionCodegen(codegen_c.space, _called_directly),
    "cuda": FusionCodegen(codegen_cuda.space, _declared_launches),
}


def _codegen(target: str) -> FusionCodegen:
    try:
        return CODEGENS[target]
    except KeyError:
        known = ", ".join(TARGET_DTYPES)
        raise ValueError(f"unknown fusion target {target!r}; known: {known}") from None


def fusion_space(problem: ProblemRef, target: str = "cpu") -> FusionSpace:
    """The fused design space of a graph problem for a target ("cpu" or "cuda")."""
    problem = _problem(problem)
    return _codegen(target).space(problem)


def param_key(params: Mapping[str, ParamValue]) -> str:
    """A normalised key of a full assignment (partition included): sorted compact JSON."""
    return json.dumps(dict(sorted(params.items())), separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class FusionPlan:
    problem: str
    target: str
    partition: str
    """The partition's key, e.g. "add+rmsnorm|gelu"."""
    groups: tuple[tuple[str, ...], ...]
    params: dict[str, ParamValue]
    """The full normalised assignment, partition included."""
    param_key: str
    source: str
    flags: tuple[str, ...]
    launches: tuple[Launch, ...] = field(default_factory=tuple, compare=False)
    """cuda only: the launches its `// kf-launch:` lines declare, in order (left out of
    equality: they are a function of `source`, and their parsed sizes compare by identity)."""
    dtype: str = "fp32"

    def event_fields(self) -> dict[str, object]:
        """The payload fields of a `FusionPlanned` event."""
        return {
            "groups": [list(g) for g in self.groups],
            "params": dict(self.params),
            "param_key": self.param_key,
        }


def plan(
    problem: ProblemRef,
    partition: str | Partition | Sequence[Sequence[str]],
    params: Mapping[str, ParamValue] | None = None,
    target: str = "cpu",
    dtype: str = "fp32",
) -> FusionPlan:
    """Render `problem` fused as `partition` with `params` for `target` and `dtype`.

    `params` are the code-generation parameters of `fusion_space(problem, target)`; any
    left out take the space's defaults, and a "partition" entry, if present, must agree
    with `partition`. Raises `InvalidParams` for an assignment outside the space."""
    problem = _problem(problem)
    space = fusion_space(problem, target)
    chosen = parse_partition(partition, space.graph.op_names)
    given = dict(params or {})
    if "partition" in given and str(given["partition"]) != chosen.key:
        raise InvalidParams(
            f"params say partition {given['partition']!r} but the plan is for {chosen.key!r}"
        )
    full: dict[str, ParamValue] = {**space.defaults, **given, "partition": chosen.key}
    rendered = space.render(full, dtype)
    launches = _codegen(space.target).launches(rendered.source, problem)
    normalised = dict(sorted(full.items()))
    return FusionPlan(
        problem=problem.name,
        target=target,
        partition=chosen.key,
        groups=chosen.groups,
        params=normalised,
        param_key=param_key(normalised),
        source=rendered.source,
        flags=rendered.flags,
        launches=launches,
        dtype=dtype,
    )


def best_known_for(space: FusionSpace, partition: str) -> dict[str, ParamValue]:
    """The hand-picked parameters of `space` moved to another partition (stash where it
    applies there, recompute where it does not)."""
    point: dict[str, ParamValue] = {**space.best_known, "partition": partition}
    if not space.is_valid(point):
        point["reuse"] = "recompute"
    return point


def groups_of(
    problem: ProblemRef, params: Mapping[str, ParamValue], target: str | None = None
) -> list[list[str]]:
    """The groups of an assignment's "partition", as `FusionPlanned.groups` wants them.

    With a target, the whole assignment (missing entries take the defaults) must lie in
    that target's space. Raises ValueError (`InvalidParams` is one) otherwise."""
    problem = _problem(problem)
    if "partition" not in params:
        raise InvalidParams("a fusion proposal needs a 'partition' parameter")
    chosen = parse_partition(str(params["partition"]), graph_of(problem).op_names)
    if target is not None:
        space = fusion_space(problem, target)
        problems = space.violations({**space.defaults, **params})
        if problems:
            raise InvalidParams(f"{space.name}: {'; '.join(problems)}")
    return chosen.as_lists()
