"""The benchmarker: times each verified kernel against the numpy baseline and the
campaign's incumbent, interleaved in one run, then re-checks it on new inputs
(`gpu_workers.benchmarker`). Benchmarkers on one host take turns through a host-wide
lock, so two kernels are never timed at the same moment."""

from __future__ import annotations

import asyncio
import fcntl
import os
import tempfile
from pathlib import Path

import msgspec

from actors.campaign import CampaignSpec
from actors.devices import calibration_for, compile_and_time, recalibrate
from actors.librarian import ask_kernel
from actors.replayer import HistoryReader
from actors.runtime import Actor, Reactions
from bus.connection import Client, jetstream
from eventstore.emitter import Emitter
from eventstore.events import (
    SYSTEM_CAMPAIGN,
    ActorRef,
    BenchmarkCompleted,
    Event,
    HostCalibrated,
    KernelRejected,
    KernelVerified,
    new_event,
)
from gpu_workers.calibration_cache import is_quiet
from gpu_workers.results import BenchmarkResult, Rejection
from kernels.loading import load_problem

LOCK_PATH = Path(tempfile.gettempdir()) / "kfactory-benchmark.lock"


class HostTurn:
    """A host-wide lock (flock) held while timing."""

    def __init__(self, path: Path = LOCK_PATH) -> None:
        self._path = path
        self._fd: int | None = None

    def __enter__(self) -> HostTurn:
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *_: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class Benchmarker(Actor):
    role = "benchmarker"
    reacts_to = (KernelVerified,)

    target: str

    def __init__(self, target: str = "cpu") -> None:
        self.target = target
        self._nc: Client | None = None
        self._reader: HistoryReader | None = None

    async def setup(self, nc: Client, ref: ActorRef) -> None:
        self._nc = nc
        self._reader = HistoryReader(nc)
        calibration = await asyncio.to_thread(calibration_for, self.target)
        await Emitter(jetstream(nc)).emit(
            new_event(
                HostCalibrated,
                campaign_id=SYSTEM_CAMPAIGN,
                actor=ref,
                device=calibration.host,
                bandwidth_gbs=calibration.memory_bandwidth_gbs,
                peak_gflops=calibration.peak_fp32_gflops,
                method={
                    "cpu": calibration.cpu_model,
                    "how": calibration.method,
                    "contention_cores": calibration.host_contention_cores,
                    "quiet": is_quiet(calibration),
                },
            )
        )

    async def handle(self, event: Event, out: Reactions) -> None:
        assert isinstance(event, KernelVerified)
        assert self._nc is not None and self._reader is not None
        history = await self._reader.catch_up(event.event_id)
        spec = history.campaigns[event.campaign_id].spec
        kernel = await ask_kernel(self._nc, event.campaign_id, event.candidate_id)
        if kernel is None:
            raise RuntimeError(f"the librarian has no source for {event.candidate_id} yet")
        incumbent = await ask_kernel(self._nc, event.campaign_id, None)
        problem = load_problem(event.problem)
        calibration = calibration_for(event.target)
        previous = None
        if incumbent is not None and incumbent.candidate_id != event.candidate_id:
            previous = (incumbent.source, tuple(incumbent.flags))

        def timed() -> BenchmarkResult | Rejection:
            with HostTurn():
                return compile_and_time(
                    event.target,
                    problem,
                    kernel.source,
                    tuple(kernel.flags),
                    event.dtype,
                    incumbent=previous,
                    calibration=calibration,
                    shape=_shape(spec, problem.dims),
                    recalibrate=lambda: recalibrate(event.target),
                )

        result = await asyncio.to_thread(timed)
        common = {**event.work(), "source_hash": event.source_hash}
        if isinstance(result, BenchmarkResult):
            out.emit(
                BenchmarkCompleted,
                median_ns=result.kernel.median_ns,
                iqr_ns=result.kernel.iqr_ns,
                baseline=result.baseline_name,
                baseline_ns=result.baseline.median_ns,
                speedup=result.speedup,
                roofline_fraction=result.roofline_fraction,
                device=calibration.host,
                seed=result.seed,
                evidence={
                    "shape": result.shape,
                    "runs": result.kernel.runs,
                    "roofline_ns": result.roofline_ns,
                    "incumbent": incumbent.candidate_id if incumbent and previous else None,
                    "speedup_vs_incumbent": result.speedup_vs_incumbent,
                    "head_to_head": msgspec.to_builtins(result.head_to_head),
                    "q1_ns": result.kernel.q1_ns,
                    "q3_ns": result.kernel.q3_ns,
                    "baseline_iqr_ns": result.baseline.iqr_ns,
                    "judged_calls": list(result.judged_calls),
                    "rechecked": list(result.rechecked),
                    "handshake_ns": result.handshake_ns,
                    "contained_by": [
                        m.name
                        for m in (result.sandbox.mechanisms if result.sandbox else ())
                        if m.applied
                    ],
                },
                **common,
            )
        else:
            out.emit(
                KernelRejected,
                stage=result.stage,
                reason=result.reason,
                evidence={"message": result.message, **result.evidence},
                **common,
            )


def _shape(spec: CampaignSpec, dims: tuple[str, ...]) -> dict[str, int] | None:
    """The campaign's first shape, or None for the problem's default."""
    if not spec.shapes:
        return None
    return dict(zip(dims, spec.shapes[0], strict=True))
