"""A build that did not happen, on every device, and the compile-stage rejection it is."""

from __future__ import annotations

import msgspec

from gpu_workers.results import Rejection


class CompileFailure(msgspec.Struct, frozen=True, kw_only=True):
    reason: str
    """cpu: bad_flags | compile_error | compile_timeout | link_error; cuda: bad_flags |
    unsupported_dtype | bad_launch | no_compiler | compile_error | compile_timeout"""
    message: str
    log: str


STATIC_REASONS = frozenset({"forbidden_include", "forbidden_construct"})
"""Refusals a compiler makes on what a source is, not on whether it builds: the static
stage's, even when only a compile step can see them (an assembler directive in the -S
output)."""


def compile_rejection(failure: CompileFailure) -> Rejection:
    """The failure as the compile (or static) stage's rejection, its log as evidence."""
    return Rejection(
        stage="static" if failure.reason in STATIC_REASONS else "compile",
        reason=failure.reason,
        message=failure.message,
        evidence={"log": failure.log},
    )
