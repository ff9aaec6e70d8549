"""The benchmarker: times each verified kernel against the baseline (numpy on a CPU;
torch, cupy or a naive kernel on a GPU) and the campaign's incumbent, interleaved in one
run, then re-checks it on new inputs (`gpu_workers.benchmarking`).

It times only while it holds the device's lease in the NATS KV (`bus.device_lease`): one
benchmarker at a time per device, on any host, and no verification or compilation
running there meanwhile (they take a share of the device between timed windows; so does
this benchmarker's own build). A window lasts a timing run's warm-up and timed rounds:
the judging and re-check after them run while verifiers share the device again, and a
repeated run (busy host, stall, a new best in doubt) or a calibration waits for a
window of its own (`TimingWindows`). Each run is set up (kernels loaded, inputs written)
before its window opens, and its judging and re-check keep a share of the device, so
two benchmarkers on one device (`kfactory run` starts two by default, `--benchmarkers`;
a swarm file's `count`) overlap one's set-up with the other's re-check, never with a
timed window. As each window opens it reads the history again: a kernel another
benchmarker timed meanwhile is not timed twice, and a best promoted since the build
gives the run up (`JobChanged`), to build against the new one outside the window.

A benchmarker that dies frees the device when its lease expires, and its message is
redelivered to another after the ack wait. One whose lease was lost while it timed (it
stalled, or was cut off, and is presumed dead) publishes nothing: its message goes back
for redelivery, and whoever times it next emits the verdict, under the same
cause-derived event id, so a late copy is dropped by the bus and the store.

The decisions are `timing_job` (the kernel and the incumbent, the campaign's best, both
from the history; None when the candidate already has its outcome) and `decide_timed`
(the verdict); `handle` does the I/O around them, and builds off the event loop before it
waits for a window, so a kernel that does not build is rejected at once. A refusal is
KernelRejected with its stage, reason and message. A `BenchmarkCompleted` (schema 2)
holds as typed fields the kernel's median, IQR and quartiles over its `samples` timed
calls, the baseline's name, median and IQR, the speedup, the `shape`, `roofline_ns` and
the roofline fraction, the `device` (the calibrated host or GPU), the `seed`, the
`incumbent` it was timed against with `speedup_vs_incumbent` and the `head_to_head`, and
the kept run's `host_contention_cores` and the `timing_attempts`. Its `evidence` keeps
the rest: the judged calls, the re-checked distributions, the handshake cost, the
`lease` (device and fencing token of the first window) and the sandbox mechanisms
applied (`contained_by`).

When a campaign's search ends, the planner asks for its final run (`FinalRunRequested`):
the benchmarker builds the top kernels it names and times them together in one
interleaved run under the device lease (`gpu_workers.final_run`), and records
`FinalRankingTimed` (each contender's mean, median, IQR and rounds in that run, and the
order by mean) or, when the run cannot be made, `FinalRunRefused` with the reason. A
campaign whose search has ended times no further kernel (`timing_job`). A final answer
asked for later (`kfactory best --final-run`) may request another final run, of a
finished campaign too; only the latest request of a campaign is timed (`final_job`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable
from typing import Any, TypeVar

import msgspec

from actors.campaign.history import History
from actors.campaign.replayer import HistoryReader
from actors.runtime import Actor, PoisonMessage, Reactions
from bus.connection import Client, jetstream
from bus.device_lease import DEVICE_LEASE_TTL, DeviceLeases, TimingWindows, device_key
from eventstore.emitter import Emitter
from eventstore.events import (
    SYSTEM_CAMPAIGN,
    ActorRef,
    BenchmarkCompleted,
    Event,
    FinalContender,
    FinalRankingTimed,
    FinalRunRefused,
    FinalRunRequested,
    HeadToHeadRecord,
    HostCalibrated,
    KernelRejected,
    KernelVerified,
    new_event,
)
from gpu_workers.calibration_cache import is_quiet
from gpu_workers.deadlines import call_deadline, recorded_pace
from gpu_workers.final_run import FinalBuilds, FinalResult, build_contenders, final_seconds
from gpu_workers.results import BenchmarkResult, HostCalibration, Rejection
from gpu_workers.targets import (
    TimingBuilds,
    build_for_timing,
    calibration_for,
    calibration_kept,
    recalibrate,
    worker_device_index,
)
from kernels.host_isa import isa_words
from kernels.loading import load_problem
from kernels.spec import Problem

T = TypeVar("T")


class TimedWindow(msgspec.Struct, frozen=True):
    """The device lease a result was timed under."""

    device: str
    token: int
    """The lease's fencing token (its KV revision at acquire)."""


class Incumbent(msgspec.Struct, frozen=True):
    """The campaign's best kernel, timed in the same run as a new one."""

    candidate_id: str
    source: str
    flags: tuple[str, ...]
    median_ns: float | None = None
    """Its recorded time: its calls in the run get a deadline from it."""


class TimingJob(msgspec.Struct, frozen=True):
    """What the benchmarker times for one verified kernel."""

    source: str
    flags: tuple[str, ...]
    shape: dict[str, int] | None
    """The campaign's first shape, or None for the problem's default."""
    incumbent: Incumbent | None
    """The campaign's best kernel so far, timed in the same run; None for the first."""


def timing_job(history: History, event: KernelVerified, dims: tuple[str, ...]) -> TimingJob | None:
    """The kernel to time and the incumbent to time it against (the campaign's best),
    from the history; None when the candidate already has its outcome (a redelivered
    message: it is not timed twice) or its campaign has finished (a job left over from a
    campaign that ended: a later campaign never waits on it). A verified kernel the
    history has no source for is refused, since its causes are all recorded by now."""
    campaign = history.campaigns.get(event.campaign_id)
    candidate = history.candidates.get(event.candidate_id)
    if campaign is None or candidate is None or candidate.written is None:
        raise PoisonMessage(
            f"no recorded kernel for {event.candidate_id} of campaign {event.campaign_id}"
        )
    settled = candidate.benchmark is not None or candidate.rejected is not None
    if settled or campaign.finished or campaign.final_requested:
        return None
    shape = dict(zip(dims, campaign.spec.shapes[0], strict=True)) if campaign.spec.shapes else None
    written = candidate.written
    best = history.best(event.campaign_id)
    incumbent = None
    if best is not None and best.written is not None:
        incumbent = Incumbent(
            best.candidate_id,
            best.written.source,
            tuple(best.written.flags),
            best.benchmark.median_ns if best.benchmark is not None else None,
        )
    return TimingJob(written.source, tuple(written.flags), shape, incumbent)


def decide_timed(
    event: KernelVerified,
    out: Reactions,
    outcome: BenchmarkResult | Rejection,
    *,
    device: str,
    incumbent: str | None,
    window: TimedWindow | None = None,
) -> None:
    """The verdict: a timed kernel is BenchmarkCompleted against the baseline (and the
    `incumbent` candidate it was timed with, if any); a refused one, whether it did not
    build, stalled, failed its re-check or beat the roofline, is KernelRejected with the
    stage, the reason and the message (the compiler's, for a build). A timed result
    records how busy the rest of the host was (`host_contention_cores`, in cores), how
    many timing runs it took, and the device lease (`window`) it was timed under."""
    common = {**event.work(), "source_hash": event.source_hash}
    if isinstance(outcome, Rejection):
        out.emit(
            KernelRejected,
            stage=outcome.stage,
            reason=outcome.reason,
            evidence={"message": outcome.message, **outcome.evidence},
            **common,
        )
        return
    out.emit(
        BenchmarkCompleted,
        median_ns=outcome.kernel.median_ns,
        iqr_ns=outcome.kernel.iqr_ns,
        baseline=outcome.baseline_name,
        baseline_ns=outcome.baseline.median_ns,
        speedup=outcome.speedup,
        roofline_fraction=outcome.roofline_fraction,
        device=device,
        seed=outcome.seed,
        shape=outcome.shape,
        q1_ns=outcome.kernel.q1_ns,
        q3_ns=outcome.kernel.q3_ns,
        samples=outcome.kernel.runs,
        baseline_iqr_ns=outcome.baseline.iqr_ns,
        roofline_ns=outcome.roofline_ns,
        incumbent=incumbent,
        speedup_vs_incumbent=outcome.speedup_vs_incumbent,
        head_to_head=msgspec.convert(
            msgspec.to_builtins(outcome.head_to_head), HeadToHeadRecord | None
        ),
        host_contention_cores=outcome.host_contention_cores,
        timing_attempts=outcome.timing_attempts,
        mean_ns=outcome.kernel.mean_ns,
        baseline_mean_ns=outcome.baseline.mean_ns,
        evidence={
            "judged_calls": list(outcome.judged_calls),
            # every timing run's own seed; a result timed before runs had one has none
            **({"attempt_seeds": list(outcome.attempt_seeds)} if outcome.attempt_seeds else {}),
            "rechecked": list(outcome.rechecked),
            "handshake_ns": outcome.handshake_ns,
            "lease": msgspec.to_builtins(window) if window else None,
            "contained_by": [
                m.name for m in (outcome.sandbox.mechanisms if outcome.sandbox else ()) if m.applied
            ],
        },
        **common,
    )


class FinalJob(msgspec.Struct, frozen=True):
    """What the benchmarker times in a campaign's final run: its contenders' kernels and
    recorded times, in the request's order, at the campaign's first shape."""

    candidate_ids: list[str]
    source_hashes: list[str]
    kernels: list[tuple[str, tuple[str, ...]]]
    """(source, flags) of each."""
    recorded_ns: list[float]
    shape: dict[str, int] | None


def final_job(
    history: History, event: FinalRunRequested, dims: tuple[str, ...]
) -> FinalJob | Rejection | None:
    """The kernels of the final run, from the history; None when the request was answered
    already (a redelivery), a later request replaced it, or the campaign finished without
    waiting for it; a rejection when the request names a kernel with no recorded source
    and timing of its own in the campaign."""
    campaign = history.campaigns.get(event.campaign_id)
    if campaign is None:
        raise PoisonMessage(f"no recorded campaign {event.campaign_id}")
    requested = campaign.final_requested
    if requested is None or requested.event_id != event.event_id:
        return None
    if campaign.final_run is not None or campaign.final_given_up:
        return None
    own = {c.candidate_id: c for c in history.campaign_candidates(event.campaign_id)}
    found = [own.get(cid) for cid in event.contenders]
    timed = [c for c in found if c is not None and c.written and c.benchmark]
    if len(timed) != len(event.contenders) or len(timed) < 2:
        return Rejection(
            stage="benchmark",
            reason="final_run_contenders",
            message=(
                f"the final run names {event.contenders}; it needs at least two kernels of "
                f"{event.campaign_id}, each with its recorded source and timing"
            ),
        )
    shape = dict(zip(dims, campaign.spec.shapes[0], strict=True)) if campaign.spec.shapes else None
    return FinalJob(
        candidate_ids=[c.candidate_id for c in timed],
        source_hashes=[c.written.source_hash for c in timed if c.written],
        kernels=[(c.written.source, tuple(c.written.flags)) for c in timed if c.written],
        recorded_ns=[c.benchmark.time_ns for c in timed if c.benchmark],
        shape=shape,
    )


def decide_final(
    out: Reactions,
    job: FinalJob | None,
    outcome: FinalResult | Rejection,
    *,
    target: str,
    device: str,
) -> None:
    """The final run's record: `FinalRankingTimed` with each contender's figures in the
    run and the order by mean, or `FinalRunRefused` with the reason."""
    if isinstance(outcome, Rejection) or job is None:
        refusal = outcome if isinstance(outcome, Rejection) else None
        out.emit(
            FinalRunRefused,
            target=target,
            reason=refusal.reason if refusal else "final_run_contenders",
            message=refusal.message if refusal else "no kernels to time",
        )
        return
    ids = job.candidate_ids
    out.emit(
        FinalRankingTimed,
        target=target,
        device=device,
        seed=outcome.seed,
        shape=outcome.shape,
        contenders=[
            FinalContender(
                candidate_id=cid,
                source_hash=source_hash,
                mean_ns=standing.stats.mean_ns,
                median_ns=standing.stats.median_ns,
                q1_ns=standing.stats.q1_ns,
                q3_ns=standing.stats.q3_ns,
                iqr_ns=standing.stats.iqr_ns,
                rounds=standing.stats.runs,
                failure=standing.failure.message if standing.failure else "",
            )
            for cid, source_hash, standing in zip(
                ids, job.source_hashes, outcome.standings, strict=True
            )
        ],
        order=[ids[n] for n in outcome.order],
        rounds=outcome.rounds,
        baseline=outcome.baseline_name,
        baseline_mean_ns=outcome.baseline.mean_ns if outcome.baseline else None,
        host_contention_cores=outcome.host_contention_cores,
        timed_seconds=outcome.timed_seconds,
    )


class Benchmarker(Actor):
    role = "benchmarker"
    reacts_to = (KernelVerified, FinalRunRequested)

    target: str
    #: A benchmarker that dies holds the device this long at most.
    lease_ttl: int = DEVICE_LEASE_TTL

    def __init__(self, target: str = "cpu") -> None:
        self.target = target
        self._reader: HistoryReader | None = None
        self._leases: DeviceLeases | None = None
        self._device = ""

    async def setup(self, nc: Client, ref: ActorRef) -> None:
        await self._join(nc, ref)
        assert self._leases is not None
        async with self._leases.timing(self._device, self.status):  # a calibration is timed too
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
                    "cores": calibration.cores,
                    "isa": isa_words(),
                    "how": calibration.method,
                    "contention_cores": calibration.host_contention_cores,
                    "quiet": is_quiet(calibration),
                },
            )
        )

    async def _join(self, nc: Client, ref: ActorRef) -> None:
        """The history, and the device's leases."""
        self._reader = HistoryReader(nc)
        self._leases = await DeviceLeases.open(jetstream(nc), ref.instance, self.lease_ttl)
        self._device = device_key(self.target, ref.host, worker_device_index(self.target))

    async def handle(self, event: Event, out: Reactions) -> None:
        """The edges: catch up, build (off the event loop, with a share of the device),
        time holding the device's lease; the decisions are `timing_job` and
        `decide_timed`. Nothing here asks the librarian: the history has the kernel and
        the incumbent."""
        if isinstance(event, FinalRunRequested):
            await self._final_run(event, out)
            return
        assert isinstance(event, KernelVerified)
        assert self._reader is not None and self._leases is not None
        history = await self._reader.catch_up(event.event_id)
        problem = await asyncio.to_thread(load_problem, event.problem)
        job = timing_job(history, event, problem.dims)
        while job is not None:
            incumbent = job.incumbent
            windows = TimingWindows(
                self._leases,
                self._device,
                asyncio.get_running_loop(),
                self.status,
                opened=functools.partial(self._still_current, event, problem.dims, incumbent),
            )
            try:
                await windows.share()  # the build and the driver's set-up, between windows
                self.status("building")
                builds = await asyncio.to_thread(
                    build_for_timing,
                    event.target,
                    problem,
                    job.source,
                    job.flags,
                    event.dtype,
                    incumbent=(incumbent.source, tuple(incumbent.flags)) if incumbent else None,
                )
                if isinstance(builds, Rejection):  # did not build: no window, no calibration
                    decide_timed(event, out, builds, device="", incumbent=None)
                    return
                timing = functools.partial(
                    self._time,
                    builds,
                    problem,
                    event.dtype,
                    job.shape,
                    windows,
                    call_seconds=_call_deadline(event, problem, job),
                )
                calibration, outcome = await _abandoned_on_cancel(
                    asyncio.to_thread(timing), windows
                )
            except JobChanged as changed:
                job = changed.job
                continue
            finally:
                await windows.release()
            windows.check()  # lost meanwhile: presumed dead, its result is not published
            decide_timed(
                event,
                out,
                outcome,
                device=calibration.host,
                incumbent=_candidate(incumbent),
                window=TimedWindow(self._device, windows.tokens[0]),
            )
            return

    async def _final_run(self, event: FinalRunRequested, out: Reactions) -> None:
        """The edges of a final run: catch up, build the contenders off the loop, time
        them holding the device's lease; the decisions are `final_job` and `decide_final`.
        A run the harness could not make is refused with its message, so the campaign
        finishes on its ranking as it was."""
        assert self._reader is not None and self._leases is not None
        history = await self._reader.catch_up(event.event_id)
        problem = await asyncio.to_thread(load_problem, event.problem)
        job = final_job(history, event, problem.dims)
        if job is None:
            return
        device = ""
        outcome: FinalResult | Rejection
        windows = TimingWindows(self._leases, self._device, asyncio.get_running_loop(), self.status)
        try:
            if isinstance(job, Rejection):
                outcome = job
            else:
                await windows.share()
                self.status("building the final run")
                builds = await asyncio.to_thread(
                    build_contenders, event.target, problem, job.kernels, event.dtype
                )
                if isinstance(builds, Rejection):
                    outcome = builds
                else:
                    timing = functools.partial(self._time_final, builds, problem, job, windows)
                    try:
                        device, outcome = await _abandoned_on_cancel(
                            asyncio.to_thread(timing), windows
                        )
                    except Exception as exc:  # the harness failed: said, never hidden
                        windows.check()  # a lost lease is not a refusal: nothing is published
                        outcome = Rejection(
                            stage="benchmark",
                            reason="final_run_failed",
                            message=f"{type(exc).__name__}: {exc}",
                        )
        finally:
            await windows.release()
        windows.check()
        decide_final(
            out,
            job if not isinstance(job, Rejection) else None,
            outcome,
            target=event.target,
            device=device,
        )

    def _time_final(
        self, builds: FinalBuilds[Any], problem: Problem, job: FinalJob, windows: TimingWindows
    ) -> tuple[str, FinalResult | Rejection]:
        """The device's name, and the final run on it, in a window of its own."""
        if not calibration_kept(self.target):
            windows.open()  # the device is measured again: alone on it
        calibration = calibration_for(self.target)
        shape = problem.full_shape(job.shape or problem.default_shape)
        return calibration.host, builds.time(
            problem,
            shape,
            llc_bytes=calibration.llc_bytes,
            max_seconds=final_seconds(job.recorded_ns),
            window=windows,
            watch=windows.watch,
        )

    async def _still_current(
        self, event: KernelVerified, dims: tuple[str, ...], incumbent: Incumbent | None
    ) -> None:
        """Run as each window opens. The history as it is now: another benchmarker may have
        timed this kernel while this one waited (a redelivery), or promoted a new best
        since the build: then the run is given up, to build against that one outside the
        window and come back."""
        assert self._reader is not None
        fresh = timing_job(await self._reader.catch_up(), event, dims)
        if fresh is None or _candidate(fresh.incumbent) != _candidate(incumbent):
            raise JobChanged(fresh)

    def _time(
        self,
        builds: TimingBuilds[Any],
        problem: Problem,
        dtype: str,
        shape: dict[str, int] | None,
        windows: TimingWindows,
        call_seconds: float | None,
    ) -> tuple[HostCalibration, BenchmarkResult | Rejection]:
        """The device's calibration, and the kernel timed against it, each timing run in
        a window of its own that opens once the run is set up and closes when its timed
        rounds end."""
        if not calibration_kept(self.target):
            windows.open()  # the device is measured again: alone on it
        calibration = calibration_for(self.target)
        return calibration, builds.time(
            problem,
            calibration,
            dtype=dtype,
            shape=shape,
            recalibrate=lambda: recalibrate(self.target),
            window=windows,
            watch=windows.watch,
            call_seconds=call_seconds,
        )


def _call_deadline(event: KernelVerified, problem: Problem, job: TimingJob) -> float | None:
    """How long each timed call may take, from the kernel's verification pace (None for a
    kernel verified before paces were recorded: the back end's run limit only)."""
    pace = recorded_pace(event.evidence)
    if pace is None:
        return None
    shape = problem.full_shape(job.shape or problem.default_shape)
    incumbent_ns = job.incumbent.median_ns if job.incumbent is not None else None
    return call_deadline(problem, shape, pace, event.dtype, incumbent_ns)


async def _abandoned_on_cancel(timing: Awaitable[T], windows: TimingWindows) -> T:
    """Await the timing thread. If this task is cancelled (the actor is stopping), the
    job is given up: the thread's run is killed at its next watch and no window opens
    for it; the cancel goes on once the thread is done, so that the windows are
    released by this task alone and no thread is left waiting on a loop that stopped."""
    running = asyncio.ensure_future(timing)
    # Given up, what the thread raises on its way out is moot: retrieved here, whenever it
    # ends (a second cancel may end the wait below first, and a cancelled shield no longer
    # looks at its inner task).
    running.add_done_callback(_moot)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        windows.abandon()
        await asyncio.wait({running})
        raise


def _moot(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


class JobChanged(Exception):
    """The kernel was timed meanwhile, or the best changed: the timing run is given up."""

    def __init__(self, job: TimingJob | None) -> None:
        super().__init__("the kernel was timed meanwhile, or the best changed")
        self.job = job


def _candidate(incumbent: Incumbent | None) -> str | None:
    return incumbent.candidate_id if incumbent is not None else None
