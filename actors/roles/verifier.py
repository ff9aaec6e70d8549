"""The verifier: compiles each written kernel and checks it against the reference in the
sandbox (`gpu_workers.verification`); emits KernelVerified or KernelRejected with evidence.

On a prechecked target (cuda) it takes `KernelCompiled` instead: the compiler already
refused what does not build or fit, and the source comes from the librarian.

Verification (the compile, the trials and their float64 references) runs with a share of
the device (`bus.device_lease`): never while a benchmarker times on it, and a benchmarker
that asks for the device waits only for the verifications already running.

The decision is `decide_verdict` (KernelVerified with the largest relative error, or
KernelRejected with the stage, the reason and the evidence; either way with the check's
secret seed); `handle` does the I/O around it.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

import msgspec

from actors.roles.messages import ask_kernel
from actors.runtime import Actor, Reactions
from bus.connection import Client, jetstream
from bus.device_lease import DeviceLeases, device_key
from eventstore.events import (
    ActorRef,
    Event,
    KernelCompiled,
    KernelRejected,
    KernelVerified,
    KernelWritten,
)
from gpu_workers.results import Verdict
from gpu_workers.targets import backend_for, target_of, worker_device_index
from gpu_workers.verification import verify
from kernels.loading import load_problem


def decide_verdict(event: KernelWritten | KernelCompiled, out: Reactions, verdict: Verdict) -> None:
    """KernelVerified with the worst error and the trials, or KernelRejected with the
    stage, the reason and the message; either way with the check's secret seed."""
    common = {**event.work(), "source_hash": event.source_hash}
    rejection = verdict.rejection
    if rejection is None:
        out.emit(
            KernelVerified,
            max_rel_err=verdict.max_rel_err or 0.0,
            trials=len(verdict.trials),
            evidence={
                "compile_cache_hit": verdict.compile_cache_hit,
                # what the deadline of its timed calls derives from (gpu_workers/deadlines.py)
                **({"pace": msgspec.to_builtins(verdict.pace)} if verdict.pace else {}),
            },
            seed=verdict.seed,
            **common,
        )
        return
    out.emit(
        KernelRejected,
        stage=rejection.stage,
        reason=rejection.reason,
        evidence={"message": rejection.message, **rejection.evidence},
        seed=verdict.seed,
        **common,
    )


class Verifier(Actor):
    role = "verifier"
    reacts_to: ClassVar[tuple[type[Event], ...]] = (KernelWritten,)

    target: str

    def __init__(self, target: str = "cpu") -> None:
        self.target = target
        self._leases: DeviceLeases | None = None
        self._device = ""

    async def setup(self, nc: Client, ref: ActorRef) -> None:
        self._leases = await DeviceLeases.open(jetstream(nc), ref.instance)
        self._device = device_key(self.target, ref.host, worker_device_index(self.target))

    @staticmethod
    def for_target(target: str) -> Verifier:
        return DeviceVerifier(target) if target_of(target).precheck else Verifier(target)

    async def handle(self, event: Event, out: Reactions) -> None:
        assert isinstance(event, KernelWritten)
        await self._verify(event, event.source, event.flags, out)

    async def _verify(
        self, event: KernelWritten | KernelCompiled, source: str, flags: list[str], out: Reactions
    ) -> None:
        assert self._leases is not None
        problem = await asyncio.to_thread(load_problem, event.problem)
        backend = backend_for(event.target)
        async with self._leases.shared(self._device, self.status):
            self.status("verifying")
            # No seed: every check draws a fresh secret one, recorded in the event for audits.
            verdict = await asyncio.to_thread(
                verify, problem, backend, source, tuple(flags), dtype=event.dtype, seed=None
            )
        decide_verdict(event, out, verdict)


class DeviceVerifier(Verifier):
    """Runs the kernels the compiler passed, on the device this host has."""

    reacts_to = (KernelCompiled,)

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self._nc: Client | None = None

    async def setup(self, nc: Client, ref: ActorRef) -> None:
        await super().setup(nc, ref)
        self._nc = nc

    async def handle(self, event: Event, out: Reactions) -> None:
        assert isinstance(event, KernelCompiled) and self._nc is not None
        kernel = await ask_kernel(self._nc, event.campaign_id, event.candidate_id)
        if kernel is None:
            raise RuntimeError(f"the librarian has no source for {event.candidate_id} yet")
        await self._verify(event, kernel.source, kernel.flags, out)
