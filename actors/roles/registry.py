"""The roles: what each does, and how to make one for a device target."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from actors.roles.benchmarker import Benchmarker
from actors.roles.compiler import Compiler
from actors.roles.fuser import Fuser
from actors.roles.kernel_writer import KernelWriter
from actors.roles.librarian import Librarian
from actors.roles.planner import Planner
from actors.roles.verifier import Verifier
from actors.runtime import Actor
from gpu_workers.targets import PRECHECKED_TARGETS, TARGETS


@dataclass(frozen=True)
class Role:
    name: str
    summary: str
    create: Callable[[str], Actor]
    """Makes an instance serving one target (roles that serve every target ignore it)."""
    targets: tuple[str, ...] | None = None
    """The targets an instance can serve; None: it serves every campaign, any target."""


def _ignore(make: Callable[[], Actor]) -> Callable[[str], Actor]:
    return lambda _target: make()


ROLES: dict[str, Role] = {
    role.name: role
    for role in (
        Role(
            "planner",
            "opens generations, proposes candidates, finishes campaigns",
            _ignore(Planner),
        ),
        Role(
            "kernel-writer",
            "renders templates and fusion plans (or asks an LLM)",
            _ignore(KernelWriter),
        ),
        Role("fuser", "turns graph-problem proposals into fusion plans", _ignore(Fuser)),
        Role(
            "compiler",
            "compiles and statically checks cuda kernels on any host (no GPU needed)",
            Compiler,
            PRECHECKED_TARGETS,
        ),
        Role(
            "verifier",
            "checks kernels against the reference on the device",
            Verifier.for_target,
            TARGETS,
        ),
        Role(
            "benchmarker",
            "times verified kernels against the baseline on the device",
            Benchmarker,
            TARGETS,
        ),
        Role(
            "librarian",
            "draws lessons, answers dedupe questions, closes generations",
            _ignore(Librarian),
        ),
    )
}
