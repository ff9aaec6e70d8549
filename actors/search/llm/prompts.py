"""Chat prompts for the LLM writer: write (from the problem alone), improve, fix, crossover;
and the agent operator's opening (a parent to improve with tools: compile, verify, time,
submit).

Every prompt states the problem exactly (signature, calling convention, shapes,
tolerances), shows the source it starts from, and lists the lessons the history holds.
`write` has no source to start from: it shows the reference's own source, the cost at the
timed shape and, once the host has been calibrated (HostCalibrated), its ceilings and the
least time they allow.
"""

from __future__ import annotations

import inspect
import json
import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import jinja2

from actors.search.operators.protocol import Context, ParentKernel
from gpu_workers.targets import target_of
from kernels.spec import Problem

MAX_SOURCE_CHARS: Final = 24_000
MAX_EVIDENCE_VALUE_CHARS: Final = 6_000
MAX_EVIDENCE_CHARS: Final = 16_000
MAX_LESSONS: Final = 20
MAX_LESSON_CHARS: Final = 400


@dataclass(frozen=True)
class RejectionEvidence:
    """Why the parent was refused, as the verifier recorded it (KernelRejected / Rejection)."""

    stage: str
    reason: str
    message: str = ""
    evidence: Mapping[str, Any] = field(default_factory=dict)


_BRIEF = """
{% if llm_brief -%}
{{ llm_brief }}
{%- else -%}
Kernels target {{ target }}.
{%- endif %}
"""
_JUDGED = """\
verified element by element against a float64 reference on fresh inputs \
from several distributions (normal, uniform, large magnitude ~1e4, tiny ~1e-15, exact ties) \
and on shapes that are not multiples of any tile; NaN never passes, inputs must stay \
unchanged, and every output element must be written. Only then is it timed.
"""
_LINKAGE = """
    {{ signature }}
with external linkage. No main() and no I/O. No global, static or thread-local variables \
(constant tables are fine)"""

_SYSTEM = (
    "You are an expert performance engineer who writes fast, correct compute kernels in C."
    + _BRIEF
    + """\
Flags: the default is `{{ default_flags }}`. To choose others, make the first line of the \
source `// kfactory-flags: <flags>`.
Every kernel is """
    + _JUDGED
    + "Answer with exactly one complete C source file in a single ```c fenced block, defining"
    + _LINKAGE
    + ": each call starts from its arguments alone."
)

_AGENT_SYSTEM = (
    "You are an expert performance engineer who improves compute kernels in C, step by step, "
    "with tools."
    + _BRIEF
    + """\
Flags: pass them as the tools' `flags` argument (the parent's by default; the target's \
default is `{{ default_flags }}`).
Every submitted kernel is """
    + _JUDGED
    + "A kernel defines"
    + _LINKAGE
    + """.
Tools: `read_lineage` and `read_lessons` tell what is known; `compile` runs the compile \
and static checks; `verify` checks the kernel at small shapes; `time` times a few calls at \
the timed shape (advice only: the swarm times it again); `submit` hands the final kernel \
in and ends your turn. You have at most {{ max_steps }} replies."""
)

_PROBLEM = """\
## Problem: {{ problem.name }}
{{ problem.description }}

Signature (exact):
    {{ signature }};
Calling convention: one pointer per array in the order above (inputs `const`), then one \
int64_t per dimension. Arrays are dense, row-major and contiguous; dtype {{ dtype }}.
Arrays:
{% for arg in problem.args -%}
- `{{ arg.name }}` [{{ arg.dims | join(", ") }}] {{ "output" if arg.output else "input" }}
{% endfor -%}
{% if problem.graph -%}
It is a chain of elementary ops: {{ problem.graph | join(" -> ") }}.
{% endif -%}
Shapes that are verified: {{ test_shapes }}.
Shape that is timed: {{ default_shape }}.
Tolerance ({{ dtype }}): |got - expected| <= {{ tol.atol }} + {{ tol.rtol }} * scale per \
element, where scale is {{ scale }}.
"""

_LESSONS = """\
## Lessons from earlier candidates
{% for lesson in lessons -%}
- {{ lesson }}
{% else -%}
(none yet)
{% endfor %}"""


def _from_parent(heading: str, task: str) -> str:
    """A prompt that shows the problem, one parent kernel under `heading`, the lessons and
    the task."""
    return (
        _PROBLEM
        + f"""
## {heading}
```c
{{{{ parent_source }}}}
```

"""
        + _LESSONS
        + f"""
## Task
{task}"""
    )


_IMPROVE = _from_parent(
    "The current kernel (verified)",
    """Write a faster kernel for this problem. Keep it exactly correct within the tolerance. \
Explain your idea in at most three sentences, then give the full source.
""",
)

_FIX = (
    _PROBLEM
    + """
## The kernel that was rejected
```c
{{ parent_source }}
```

## Why it was rejected
Stage: {{ rejection.stage }}
Reason: {{ rejection.reason }}
{% if rejection.message -%}
Message: {{ rejection.message }}
{% endif -%}
{% for name, value in evidence -%}
### {{ name }}
````
{{ value }}
````
{% endfor %}
"""
    + _LESSONS
    + """
## Task
Fix the kernel so that it passes this stage and every later one, keeping what makes it \
fast. Say in one or two sentences what was wrong, then give the full corrected source.
"""
)

_CROSSOVER = (
    _PROBLEM
    + """
## Kernel A (verified)
```c
{{ source_a }}
```

## Kernel B (verified)
```c
{{ source_b }}
```

"""
    + _LESSONS
    + """
## Task
A and B take different approaches. Write one kernel that combines the strengths of both \
and is faster than either, exactly correct within the tolerance. Name what you take from \
each in at most three sentences, then give the full source.
"""
)

_WRITE = (
    _PROBLEM
    + """
## The reference (float64 numpy; the kernel must agree with it)
```python
{{ reference_source }}
```

## Cost at the timed shape
{{ cost.bytes_moved }} bytes moved and {{ cost.flops }} floating-point operations \
({{ "%.2f" | format(intensity) }} flop per byte).
{% if ceilings -%}
Host ceilings (measured on {{ ceilings.device }}): {{ "%.1f" | format(ceilings.bandwidth_gbs) }} \
GB/s memory bandwidth, {{ "%.1f" | format(ceilings.peak_gflops) }} GFLOP/s fp32 peak, \
{{ cores }} cores. So the timed shape cannot run faster than about \
{{ "%.1f" | format(floor_us) }} us; a kernel near that bound is the goal.
{% else -%}
Host ceilings: not measured yet; {{ cores }} cores.
{% endif %}
"""
    + _LESSONS
    + """
## Task
No kernel has been written for this problem yet. Write the first one: correct within the \
tolerance on every shape (including ragged ones), and as fast as you can make it on this \
host. Say in at most three sentences how it works, then give the full source.
"""
)


@dataclass(frozen=True)
class HostCeilings:
    """The measured ceilings of the host that times the kernels (HostCalibrated)."""

    device: str
    bandwidth_gbs: float
    peak_gflops: float


_AGENT = _from_parent(
    "The kernel to improve (flags: `{{ parent_flags }}`)",
    """Make this kernel faster while keeping it correct within the tolerance. Edit it, compile \
it, verify it and time it with the tools, repair what fails, then submit the full source.
""",
)

_ENV = jinja2.Environment(
    loader=jinja2.DictLoader(
        {
            "system": _SYSTEM,
            "agent_system": _AGENT_SYSTEM,
            "agent": _AGENT,
            "write": _WRITE,
            "improve": _IMPROVE,
            "fix": _FIX,
            "crossover": _CROSSOVER,
        }
    ),
    undefined=jinja2.StrictUndefined,
    autoescape=False,
    keep_trailing_newline=True,
)


def cap(text: str, limit: int) -> str:
    """`text` if it fits, else its head and tail around a note of what was left out."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[-tail:]}"


def _lessons(lessons: Sequence[str]) -> list[str]:
    kept = [cap(" ".join(lesson.split()), MAX_LESSON_CHARS) for lesson in lessons if lesson.strip()]
    return kept[:MAX_LESSONS]


def _evidence_items(evidence: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each value verbatim when it fits; long ones keep their head and tail."""
    items: list[tuple[str, str]] = []
    budget = MAX_EVIDENCE_CHARS
    for name in sorted(evidence):
        value = evidence[name]
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        text = cap(text.rstrip("\n"), min(MAX_EVIDENCE_VALUE_CHARS, max(budget, 200)))
        budget -= len(text)
        items.append((str(name), text))
    return items


def _messages(
    name: str,
    problem: Problem,
    target: str,
    dtype: str,
    system_name: str = "system",
    **context: Any,
) -> list[dict[str, str]]:
    signature = problem.c_signature(dtype)
    device = target_of(target)
    common = {
        "problem": problem,
        "signature": signature,
        "target": target,
        "dtype": dtype,
        "llm_brief": device.llm_brief,
        "default_flags": " ".join(device.default_flags),
        "tol": problem.tolerances[dtype],
        "test_shapes": ", ".join(json.dumps(s) for s in problem.test_shapes),
        "default_shape": json.dumps(problem.default_shape),
        "scale": "|expected|"
        if problem.error_scale is None
        else "a per-element magnitude the problem defines (see its description)",
    }
    system = _ENV.get_template(system_name).render(**common, **context)
    user = _ENV.get_template(name).render(**common, **context)
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def reference_source(problem: Problem) -> str:
    try:
        return textwrap.dedent(inspect.getsource(problem.reference)).rstrip()
    except (OSError, TypeError):
        return f"(the source of {problem.name}'s reference cannot be read)"


def write(
    problem: Problem,
    lessons: Sequence[str],
    *,
    target: str = "cpu",
    dtype: str = "fp32",
    ceilings: HostCeilings | None = None,
) -> list[dict[str, str]]:
    """Generation 0 from a blank page: the problem alone, its reference's source, its cost
    at the timed shape and the host's ceilings."""
    cost = problem.cost_for(problem.default_shape, dtype)
    floor_s = 0.0
    if ceilings is not None:
        floor_s = max(
            cost.bytes_moved / (ceilings.bandwidth_gbs * 1e9),
            cost.flops / (ceilings.peak_gflops * 1e9),
        )
    return _messages(
        "write",
        problem,
        target,
        dtype,
        reference_source=cap(reference_source(problem), MAX_SOURCE_CHARS),
        cost=cost,
        intensity=cost.flops / max(cost.bytes_moved, 1),
        ceilings=ceilings,
        cores=os.cpu_count() or 1,
        floor_us=floor_s * 1e6,
        lessons=_lessons(lessons),
    )


def improve(
    problem: Problem,
    parent_source: str,
    lessons: Sequence[str],
    *,
    target: str = "cpu",
    dtype: str = "fp32",
) -> list[dict[str, str]]:
    return _messages(
        "improve",
        problem,
        target,
        dtype,
        parent_source=cap(parent_source.rstrip(), MAX_SOURCE_CHARS),
        lessons=_lessons(lessons),
    )


def fix(
    problem: Problem,
    parent_source: str,
    rejection_evidence: RejectionEvidence,
    lessons: Sequence[str] = (),
    *,
    target: str = "cpu",
    dtype: str = "fp32",
) -> list[dict[str, str]]:
    return _messages(
        "fix",
        problem,
        target,
        dtype,
        parent_source=cap(parent_source.rstrip(), MAX_SOURCE_CHARS),
        rejection=rejection_evidence,
        evidence=_evidence_items(rejection_evidence.evidence),
        lessons=_lessons(lessons),
    )


def crossover(
    problem: Problem,
    source_a: str,
    source_b: str,
    lessons: Sequence[str],
    *,
    target: str = "cpu",
    dtype: str = "fp32",
) -> list[dict[str, str]]:
    return _messages(
        "crossover",
        problem,
        target,
        dtype,
        source_a=cap(source_a.rstrip(), MAX_SOURCE_CHARS // 2),
        source_b=cap(source_b.rstrip(), MAX_SOURCE_CHARS // 2),
        lessons=_lessons(lessons),
    )


def agent(
    problem: Problem, parent: ParentKernel, context: Context, *, dtype: str, max_steps: int
) -> list[dict[str, str]]:
    """The agent operator's opening: the problem, the parent to improve and the context's
    lessons, for its target."""
    return _messages(
        "agent",
        problem,
        context.target,
        dtype,
        system_name="agent_system",
        parent_source=cap(parent.source.rstrip(), MAX_SOURCE_CHARS),
        parent_flags=" ".join(parent.flags),
        lessons=_lessons(context.lessons),
        max_steps=max_steps,
    )
