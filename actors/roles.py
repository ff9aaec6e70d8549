"""The six roles: what each does, and how to make one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from actors.benchmarker import Benchmarker
from actors.fuser import Fuser
from actors.kernel_writer import KernelWriter
from actors.librarian import Librarian
from actors.planner import Planner
from actors.runtime import Actor
from actors.verifier import Verifier


@dataclass(frozen=True)
class Role:
    name: str
    summary: str
    create: Callable[[], Actor]


ROLES: dict[str, Role] = {
    role.name: role
    for role in (
        Role("planner", "opens generations, proposes candidates, finishes campaigns", Planner),
        Role("kernel-writer", "renders templates and fusion plans (or asks an LLM)", KernelWriter),
        Role("fuser", "turns graph-problem proposals into fusion plans", Fuser),
        Role("verifier", "compiles and checks kernels against the reference", Verifier),
        Role("benchmarker", "times verified kernels against the baseline", Benchmarker),
        Role("librarian", "draws lessons, answers dedupe questions, closes generations", Librarian),
    )
}
