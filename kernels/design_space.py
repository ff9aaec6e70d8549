"""What a design space is: named parameters with finite choices, constraints over a full
assignment, and a `Template` that renders one valid assignment into (source, flags) for a
target and dtype. Plain data, so a planner can search any space the same way; the
registry of concrete templates is `kernels.templates`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jinja2

ParamValue = int | str | bool
Params = Mapping[str, ParamValue]


def _environment(folder: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("kernels", folder),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


CUDA_TYPES = {"fp32": "float", "bf16": "__nv_bfloat16", "fp16": "__half"}
CUDA_FLAGS: tuple[str, ...] = ("-O3", "-O3 --use_fast_math")
"""The nvcc flags a cuda point may choose (every cuda space's "flags"); the compiler adds -arch."""


def _openmp(params: Params) -> tuple[str, ...]:
    """-fopenmp with threads, else -fopenmp-simd."""
    return ("-fopenmp" if int(params.get("threads", 1)) != 1 else "-fopenmp-simd",)


def _no_flags(params: Params) -> tuple[str, ...]:
    return ()


def _float_only(dtype: str) -> dict[str, Any]:
    """Templates written for float alone: nothing names the element type."""
    return {}


def _cuda_element_type(dtype: str) -> dict[str, Any]:
    return {"dtype": dtype, "T": CUDA_TYPES[dtype]}


@dataclass(frozen=True)
class TemplateTarget:
    """How one target's templates are written and rendered."""

    environment: jinja2.Environment
    """Its jinja template folder."""
    dtypes: tuple[str, ...]
    """The element types its templates are written for."""
    element_context: Callable[[str], dict[str, Any]]
    """What a jinja file is given for a dtype, besides the point's parameters."""
    added_flags: Callable[[Params], tuple[str, ...]]
    """The compiler flags a point gets besides its own "flags"."""


TEMPLATE_TARGETS: dict[str, TemplateTarget] = {
    "cpu": TemplateTarget(_environment("cpu_templates"), ("fp32",), _float_only, _openmp),
    "cuda": TemplateTarget(
        _environment("cuda_templates"),
        ("fp32", "bf16", "fp16"),
        _cuda_element_type,
        _no_flags,
    ),
}
TARGET_DTYPES: dict[str, tuple[str, ...]] = {
    name: target.dtypes for name, target in TEMPLATE_TARGETS.items()
}
"""The element types each target's templates are written for."""


def render_file(target: str, file: str, /, **context: Any) -> str:
    """A jinja file of a target's template folder, rendered."""
    return TEMPLATE_TARGETS[target].environment.get_template(file).render(**context)


def compiler_flags(target: str, params: Params) -> tuple[str, ...]:
    """The point's "flags", plus the target's (OpenMP for cpu)."""
    return (*str(params["flags"]).split(), *TEMPLATE_TARGETS[target].added_flags(params))


@dataclass(frozen=True)
class Param:
    name: str
    choices: tuple[ParamValue, ...]
    doc: str
    before: ParamValue | None = None
    """The value a point recorded before this parameter existed takes: the one that renders
    the kernel the template rendered then (None: a parameter from the start)."""
    added: tuple[ParamValue, ...] = ()
    """Choices added since the parameter first was: a search replayed as it ran before
    them (`tests/decision_log.py`) leaves them out."""


@dataclass(frozen=True)
class Constraint:
    name: str
    doc: str
    holds: Callable[[Params], bool]
    implies: Callable[[Params], dict[str, ParamValue]] | None = None
    """For a structure that fixes parameters it ignores: the values it fixes at a point
    (empty where it fixes none). The search sets them (`Template.canonical`) instead of
    discarding the point, so such a structure is proposed as often as any other."""


def implied(
    name: str, doc: str, when: Callable[[Params], bool], values: Mapping[str, ParamValue]
) -> Constraint:
    """The constraint that where `when` holds, the parameters of `values` take those values."""

    def holds(p: Params) -> bool:
        return not when(p) or all(p[k] == v for k, v in values.items())

    def implies(p: Params) -> dict[str, ParamValue]:
        return dict(values) if when(p) else {}

    return Constraint(name, doc, holds, implies)


@dataclass(frozen=True)
class Rendered:
    source: str
    flags: tuple[str, ...]


class InvalidParams(ValueError):
    """An assignment outside the space or violating a constraint."""


@dataclass(frozen=True)
class Template:
    name: str
    problem: str
    target: str
    file: str
    algorithm: str
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...]
    defaults: dict[str, ParamValue]
    best_known: dict[str, ParamValue]
    """The hand-picked point. For cpu, the best found by hand (the kernels in
    `kernels/examples/`); for cuda, an unmeasured starting guess for H100/H200, written
    before any run on a GPU."""
    known_elsewhere: tuple[dict[str, ParamValue], ...] = field(default=(), kw_only=True)
    """Points measured fastest on other kinds of host, outside the space of some (an
    explicit AVX-512 one): a search starts from each that is valid here as well."""

    def space(self) -> dict[str, tuple[ParamValue, ...]]:
        return {p.name: p.choices for p in self.params}

    def violations(self, params: Params) -> list[str]:
        params = self.completed(params)
        problems: list[str] = []
        for p in self.params:
            if p.name not in params:
                problems.append(f"missing parameter {p.name}")
            elif params[p.name] not in p.choices:
                problems.append(f"{p.name}={params[p.name]!r} not in {p.choices}")
        extra = set(params) - {p.name for p in self.params}
        problems += [f"unknown parameter {name}" for name in sorted(extra)]
        if not problems:
            problems += [c.name for c in self.constraints if not c.holds(params)]
        return problems

    def is_valid(self, params: Params) -> bool:
        return not self.violations(params)

    def valid_points(self) -> Iterator[dict[str, ParamValue]]:
        names = [p.name for p in self.params]
        for values in itertools.product(*(p.choices for p in self.params)):
            point = dict(zip(names, values, strict=True))
            if self.is_valid(point):
                yield point

    def accepts(self, dtype: str) -> bool:
        return dtype in TARGET_DTYPES[self.target]

    def canonical(self, params: Params) -> dict[str, ParamValue]:
        """`params` with the values its structures fix set (`Constraint.implies`): one
        kernel, whatever the point said of parameters that kernel ignores."""
        point = dict(params)
        for _ in self.constraints:  # an implied value may be what another reads
            fixed = {**point}
            for c in self.constraints:
                if c.implies is not None:
                    fixed.update(c.implies(fixed))
            if fixed == point:
                break
            point = fixed
        return point

    def completed(self, params: Params) -> dict[str, ParamValue]:
        """`params` with each parameter added since it was recorded at its `before` value,
        so that a stored point renders as it did."""
        added = {p.name: p.before for p in self.params if p.before is not None}
        return {**added, **params}

    def render(self, params: Params, dtype: str = "fp32") -> Rendered:
        """The source and flags of one valid assignment (a point recorded before a parameter
        existed takes its `before` value, here and in `violations`), for elements of
        `dtype`."""
        params = self.completed(params)
        problems = self.violations(params)
        if not self.accepts(dtype):
            problems.append(f"dtype {dtype!r}: {self.name} is not written for it")
        if problems:
            raise InvalidParams(f"{self.name}: {'; '.join(problems)}")
        return self.generate(params, dtype)

    def generate(self, params: Params, dtype: str) -> Rendered:
        """What `render` returns once it has checked `params` and `dtype`: here, the jinja
        file rendered with the parameters and the target's `element_context`."""
        context: dict[str, Any] = {**params, **TEMPLATE_TARGETS[self.target].element_context(dtype)}
        source = render_file(self.target, self.file, template=self.name, **context)
        return Rendered(source=source, flags=compiler_flags(self.target, params))
