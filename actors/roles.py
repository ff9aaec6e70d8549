"""The six roles, and the issue each one lands with.

A role whose implementation has not landed yet is listed with the issue that brings
it, so `kfactory actor --help` says so instead of pretending.
"""

from __future__ import annotations

from dataclasses import dataclass

from actors.runtime import Actor


@dataclass(frozen=True)
class Role:
    name: str
    summary: str
    lands_with: str | None = None  # the issue that brings it; None once implemented

    def create(self) -> Actor:
        raise NotImplementedError(
            f"the {self.name} role is not implemented yet; it lands with {self.lands_with}"
        )


ROLES: dict[str, Role] = {
    role.name: role
    for role in (
        Role("planner", "opens generations and proposes candidates", "issue #4 (the swarm)"),
        Role("kernel-writer", "renders templates or asks an LLM for kernels", "issue #4"),
        Role("fuser", "turns graph proposals into fusion plans", "issue #4"),
        Role("verifier", "compiles and checks kernels against the reference", "issue #4"),
        Role("benchmarker", "times verified kernels against the baseline", "issue #4"),
        Role("librarian", "draws lessons, dedupes, closes generations", "issue #4"),
    )
}
