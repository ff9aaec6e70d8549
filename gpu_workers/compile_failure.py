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


def compile_rejection(failure: CompileFailure) -> Rejection:
    """The failure as the compile stage's rejection, the compiler's log as evidence."""
    return Rejection(
        stage="compile",
        reason=failure.reason,
        message=failure.message,
        evidence={"log": failure.log},
    )
