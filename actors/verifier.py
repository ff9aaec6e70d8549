"""The verifier: compiles each written kernel and checks it against the reference in the
sandbox (`gpu_workers.verifier`); emits KernelVerified or KernelRejected with evidence."""

from __future__ import annotations

import asyncio

from actors.devices import backend_for
from actors.runtime import Actor, Reactions
from eventstore.events import Event, KernelRejected, KernelVerified, KernelWritten
from gpu_workers.verifier import verify
from kernels.loading import load_problem


class Verifier(Actor):
    role = "verifier"
    reacts_to = (KernelWritten,)

    def __init__(self, target: str = "cpu") -> None:
        self.target = target

    async def handle(self, event: Event, out: Reactions) -> None:
        assert isinstance(event, KernelWritten)
        problem = load_problem(event.problem)
        backend = backend_for(event.target)
        verdict = await asyncio.to_thread(
            verify, problem, backend, event.source, tuple(event.flags)
        )
        common = {**event.work(), "source_hash": event.source_hash}
        if verdict.rejection is None:
            out.emit(
                KernelVerified,
                max_rel_err=verdict.max_rel_err or 0.0,
                trials=len(verdict.trials),
                evidence={"compile_cache_hit": verdict.compile_cache_hit},
                **common,
            )
        else:
            rejection = verdict.rejection
            out.emit(
                KernelRejected,
                stage=rejection.stage,
                reason=rejection.reason,
                evidence={"message": rejection.message, **rejection.evidence},
                **common,
            )
