"""The compiler: the compile and static stages of a scarce device's kernels, on any host.

For the cuda target, a laptop (or any CPU host) builds each written kernel for the
device's architecture (this host's GPU; sm_90, Hopper, on a host without one) and refuses
what cannot run well there (spills, too many registers, too much shared memory) with the
assembler's evidence. What passes is `KernelCompiled`, the work of the device's own
verifier; so GPU time goes only to kernels that build and fit.
"""

from __future__ import annotations

import asyncio

import msgspec

from actors.runtime import Actor, Reactions
from eventstore.events import Event, KernelCompiled, KernelRejected, KernelWritten
from gpu_workers.targets import PRECHECKED_TARGETS, backend_for
from gpu_workers.verification import precheck
from kernels.loading import load_problem


class Compiler(Actor):
    role = "compiler"
    reacts_to = (KernelWritten,)

    def __init__(self, target: str = "cuda") -> None:
        if target not in PRECHECKED_TARGETS:
            raise ValueError(
                f"the compiler serves {', '.join(PRECHECKED_TARGETS)}; "
                f"{target} kernels are compiled by their verifier"
            )
        self.target = target

    async def handle(self, event: Event, out: Reactions) -> None:
        assert isinstance(event, KernelWritten)
        problem = load_problem(event.problem)
        backend = backend_for(event.target)
        outcome = await asyncio.to_thread(
            precheck, problem, backend, event.source, tuple(event.flags), event.dtype
        )
        common = {**event.work(), "source_hash": event.source_hash}
        if outcome.rejection is not None or outcome.build is None:
            rejection = outcome.rejection
            assert rejection is not None
            out.emit(
                KernelRejected,
                stage=rejection.stage,
                reason=rejection.reason,
                evidence={"message": rejection.message, **rejection.evidence},
                **common,
            )
            return
        build = outcome.build
        out.emit(
            KernelCompiled,
            arch=build.arch,
            resources=[msgspec.to_builtins(r) for r in build.resources],
            evidence={"compile_cache_hit": outcome.cache_hit},
            **common,
        )
