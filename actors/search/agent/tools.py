"""The agent operator's tools: their definitions as the chat API takes them, and the
`Workbench` that runs them on the agent's drafts and answers in bounded text.

- `read_lineage`: the parent's steps from its root and the evidence on it (verdict, worst
  element, rejection, median, roofline fraction), as the history holds them;
- `read_lessons`: the librarian's lessons for the problem and target;
- `compile`: the compile and static stages (`gpu_workers.probes.probe_compile`): the
  compiler's first error lines, or that both passed;
- `verify`: verification at the smallest test shapes, in the sandboxed harness: the
  verdict and its worst element;
- `time`: a few timed calls at the campaign's shape: the median in ms against the
  baseline's (advice: never a figure of the campaign);
- `submit`: the final kernel; it ends the loop.

Every tool but the readers takes `{"source": str, "flags": [str, ...]}` (flags default to
the parent's). Arguments that are not a JSON object with a source of text are
`BadArguments`, which ends the variation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from openai.types.chat import ChatCompletionFunctionToolParam

from actors.search.operators.protocol import ParentKernel
from gpu_workers.probes import (
    QuickTime,
    probe_backend,
    probe_compile,
    probe_time,
    probe_verify,
)
from gpu_workers.results import Rejection
from kernels.spec import Problem

MAX_RESULT_CHARS: Final = 2_000
"""A tool's answer, at most."""
MAX_ARGUMENT_BYTES: Final = 128 * 1024
"""A tool call's arguments, at most, as JSON with every non-ASCII character escaped (more
than any event encoding takes): larger ones are refused, so the arguments of a submission
are recorded whole in its AgentStep (it is read back from them), well under the event cap."""
MAX_FLAGS: Final = 32

READ_LINEAGE = "read_lineage"
READ_LESSONS = "read_lessons"
COMPILE = "compile"
VERIFY = "verify"
TIME = "time"
SUBMIT = "submit"


def _tool(name: str, description: str, takes_source: bool) -> ChatCompletionFunctionToolParam:
    properties: dict[str, Any] = {}
    required: list[str] = []
    if takes_source:
        properties = {
            "source": {"type": "string", "description": "the whole C source file"},
            "flags": {
                "type": "array",
                "items": {"type": "string"},
                "description": "compiler flags (default: the parent's)",
            },
        }
        required = ["source"]
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


TOOLS: Final[list[ChatCompletionFunctionToolParam]] = [
    _tool(READ_LINEAGE, "The parent's lineage and the evidence on it.", False),
    _tool(READ_LESSONS, "The lessons learned for this problem and target.", False),
    _tool(COMPILE, "Compile the kernel and run the static checks.", True),
    _tool(VERIFY, "Verify the kernel against the reference at small shapes.", True),
    _tool(TIME, "Time a few calls at the campaign's shape (advice only).", True),
    _tool(SUBMIT, "Submit the final kernel; this ends the task.", True),
]
TOOL_NAMES: Final = frozenset(t["function"]["name"] for t in TOOLS)


class BadArguments(ValueError):
    """A tool call whose arguments are not what its definition asks for."""


@dataclass(frozen=True)
class Draft:
    """A kernel the agent handed to a tool."""

    source: str
    flags: tuple[str, ...]


def encoded_size(text: str) -> int:
    """The bytes `text` takes as a JSON string, at most."""
    return len(json.dumps(text))


def recorded_arguments(arguments: str) -> str:
    """A tool call's arguments as recorded: whole within `MAX_ARGUMENT_BYTES`, else cut to
    what fits however they encode (6 bytes a character at most)."""
    if encoded_size(arguments) <= MAX_ARGUMENT_BYTES:
        return arguments
    return bounded(arguments, MAX_ARGUMENT_BYTES // 6 - 100)


def bounded(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    """`text` cut at `limit` characters, with a line saying so."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[cut: {len(text) - limit} more characters]"


def parse_draft(arguments: str, default_flags: Sequence[str]) -> Draft:
    """The draft in a tool call's arguments (JSON text), or `BadArguments` saying why not."""
    if encoded_size(arguments) > MAX_ARGUMENT_BYTES:
        raise BadArguments(f"the arguments take more than {MAX_ARGUMENT_BYTES} bytes")
    try:
        found = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        raise BadArguments(f"the arguments are not JSON ({exc.msg})") from None
    if not isinstance(found, dict):
        raise BadArguments("the arguments are not a JSON object")
    source, flags = found.get("source"), found.get("flags", list(default_flags))
    if not isinstance(source, str) or not source.strip():
        raise BadArguments("`source` must be the kernel's C source, as text")
    if (
        not isinstance(flags, list)
        or len(flags) > MAX_FLAGS
        or not all(isinstance(f, str) for f in flags)
    ):
        raise BadArguments(f"`flags` must be a list of at most {MAX_FLAGS} strings")
    return Draft(source, tuple(flags))


def describe_rejection(rejection: Rejection) -> str:
    """A rejection as the agent reads it: the stage, the reason, the message, the log."""
    lines = [f"REJECTED at {rejection.stage}: {rejection.reason}", rejection.message.strip()]
    log = str(rejection.evidence.get("log", "")).strip()
    if log:
        lines += ["compiler log:", log]
    return bounded("\n".join(line for line in lines if line))


@dataclass(frozen=True)
class Workbench:
    """What the tools work on: the problem at the campaign's dtype and timed shape (None:
    the problem's default), the parent and the lessons."""

    problem: Problem
    target: str
    dtype: str
    shape: dict[str, int] | None
    parent: ParentKernel
    lessons: tuple[str, ...]

    def read(self, name: str) -> str:
        """A reader's answer."""
        if name == READ_LESSONS:
            return bounded("\n".join(f"- {x}" for x in self.lessons) or "(no lessons yet)")
        return bounded(self._lineage())

    def run(self, name: str, draft: Draft) -> str:
        """A tool's answer on a draft (blocking: compiles and runs in the sandbox)."""
        backend = probe_backend(self.target)
        args = (self.problem, backend, draft.source, draft.flags, self.dtype)
        if name == COMPILE:
            rejection = probe_compile(*args)
            return describe_rejection(rejection) if rejection else "OK: compiled, static passed"
        if name == VERIFY:
            verdict = probe_verify(*args)
            if verdict.rejection is not None:
                return describe_rejection(verdict.rejection)
            worst = verdict.worst
            at = (
                f"; worst element {worst.output}{list(worst.index)} at shape {worst.shape} "
                f"({worst.distribution}): got {worst.got:.8g}, expected {worst.expected:.8g}, "
                f"{worst.used:.1%} of the tolerance"
                if worst
                else ""
            )
            return bounded(
                f"VERIFIED at {len(verdict.trials)} small trials, max relative error "
                f"{verdict.max_rel_err or 0.0:.3g}{at}"
            )
        timed = probe_time(*args, self.shape)
        if isinstance(timed, Rejection):
            return describe_rejection(timed)
        return _quick_time(timed)

    def _lineage(self) -> str:
        parent = self.parent
        lines = [f"parent {parent.candidate_id}, flags {' '.join(parent.flags)}"]
        for number, step in enumerate(parent.lineage, 1):
            params = ", ".join(f"{k}={v}" for k, v in step.params)
            lines.append(f"step {number}: {step.operator}({params}) from {', '.join(step.parents)}")
        if not parent.lineage:
            lines.append("a root kernel (a seed or a template point): no operator steps")
        evidence = parent.evidence
        if evidence is not None:
            verdict = {True: "verified", False: "rejected", None: "not judged"}[evidence.verified]
            lines.append(f"verdict: {verdict} {evidence.rejection}".rstrip())
            if evidence.worst:
                lines.append(f"worst element: {evidence.worst}")
            if evidence.median_ns is not None:
                lines.append(f"median: {evidence.median_ns / 1e6:.4g} ms")
            if evidence.roofline_fraction is not None:
                lines.append(f"roofline fraction: {evidence.roofline_fraction:.3g}")
        return "\n".join(lines)


def _quick_time(timed: QuickTime) -> str:
    return (
        f"median {timed.median_ns / 1e6:.4g} ms over {timed.runs} calls at {timed.shape} "
        f"(the baseline: {timed.baseline_ns / 1e6:.4g} ms); advice only"
    )
