"""Templates as one operator among several: a template kernel's point moved one step along
one of its parameters, and the kernel rendered again.

A kernel rendered from one of the built-in templates (`ParentKernel.point`: the template
and its point) is varied inside the template's design space, as the template search
varies it, while the other operators edit its source (a source edit leaves the space: such
a child has no point, and this operator refuses it). The template search itself is
unchanged (`writer.kind = "template"`).

Parameters: parameter (which one: an index into the template's parameter names in sorted
order, modulo their count), step (+1 or -1 along that parameter's choices).
Refusals: no_template (the parent is no rendering of a built-in template), edge (no
choice that way), invalid_point (the template's constraints refuse the point, or it is not
written for the dtype).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from actors.search.operators.base import Change, Job, SourceOperator
from actors.search.operators.c_ast import Edit
from actors.search.operators.protocol import Params, ParamSpace, Refuse, TemplatePoint
from kernels.design_space import InvalidParams, ParamValue
from kernels.templates import TEMPLATES

MAX_PARAMETERS = 12
"""The `parameter` index's range (the templates have at most this many)."""


def moved(point: TemplatePoint, params: Mapping[str, ParamValue]) -> TemplatePoint:
    """The point one step away (raises `Refuse` where there is none)."""
    name, items = point
    template = TEMPLATES.get(name)
    if template is None:
        raise Refuse("no_template", f"{name} is not a built-in template")
    values = dict(items)
    names = sorted(template.space())
    changed = names[int(params["parameter"]) % len(names)]
    choices = template.space()[changed]
    at = choices.index(values[changed]) if values.get(changed) in choices else None
    to = None if at is None else at + int(params["step"])
    if to is None or not 0 <= to < len(choices):
        raise Refuse("edge", f"{name}: no value of {changed} that way from {values.get(changed)!r}")
    values[changed] = choices[to]
    return name, tuple(sorted(values.items()))


class TemplateStep(SourceOperator):
    name = "template"
    SPACE: ClassVar[ParamSpace] = {
        "parameter": tuple(range(MAX_PARAMETERS)),
        "step": (1, -1),
    }

    def change(self, job: Job) -> Change:
        parent = job.parents[0]
        if parent.point is None:
            raise Refuse("no_template", "the parent's source is no template's rendering")
        point = moved(parent.point, job.params)
        try:
            rendered = TEMPLATES[point[0]].render(dict(point[1]), job.context.dtype)
        except InvalidParams as exc:
            raise Refuse("invalid_point", str(exc)) from exc
        return Change((Edit(0, len(job.src.data), rendered.source),), rendered.flags, point)


def point_after(point: TemplatePoint | None, params: Params) -> TemplatePoint | None:
    """The point a `template` step with `params` leads to from `point` (None: none)."""
    if point is None:
        return None
    try:
        return moved(point, params)
    except Refuse:
        return None
