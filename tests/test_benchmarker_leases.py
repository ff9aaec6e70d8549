"""Two benchmarkers against a real nats-server, recorder and DuckDB store: one freezes while
it holds the device (presumed dead: no lease renewals, no progress reports), its job is
redelivered to the other, which times it under a new lease; the frozen one, when it wakes,
publishes nothing, and a late answer from it (as from a worker cut off from the KV) is
counted once. And a verifier that waits out a timed window on its host."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import pytest

from actors.campaign.history import History
from actors.roles.benchmarker import Benchmarker
from actors.roles.verifier import Verifier
from actors.runtime import ActorRuntime, Reactions
from bus.connection import Client, Msg, connect, id_key, jetstream
from bus.device_lease import DeviceLeases, TimingWindows, device_key
from eventstore.codec import decode
from eventstore.emitter import Emitter, outgoing
from eventstore.events import (
    SYSTEM_CAMPAIGN,
    ActorRef,
    BenchmarkCompleted,
    CampaignStarted,
    CandidateProposed,
    GenerationOpened,
    HostCalibrated,
    KernelVerified,
    KernelWritten,
    new_event,
)
from gpu_workers.results import BenchmarkResult, HostCalibration, Rejection, TimingStats
from gpu_workers.targets import TimingBuilds, worker_device_index
from kernels.spec import Problem
from ops.hub import Hub
from tests.recorded_campaign import TWO_GENERATIONS, load_log

VERIFIER = ActorRef(role="verifier", instance="verifier-t", host="test")
CALIBRATION = HostCalibration(
    host="stand-in",
    cpu_model="stand-in",
    cores=1,
    llc_bytes=1 << 20,
    memory_bandwidth_gbs=1.0,
    numpy_copy_bandwidth_gbs=1.0,
    peak_fp32_gflops=1.0,
    sgemm_gflops=1.0,
    fma_peak_gflops=1.0,
    streaming_stores=True,
    measured_at="2000-01-01T00:00:00+00:00",
    method="stand-in",
    host_contention_cores=0.0,
)


def _stats(ns: float) -> TimingStats:
    return TimingStats(
        mean_ns=ns, median_ns=ns, q1_ns=ns, q3_ns=ns, iqr_ns=0.0, min_ns=ns, max_ns=ns, runs=30
    )


class StandInBenchmarker(Benchmarker):
    """The real benchmarker (consumer, history, build, device lease, verdict) with a
    stand-in for the calibration and the timing run, which report who timed; `freeze`,
    when given, blocks this benchmarker's event loop while it times, as SIGSTOP would."""

    ack_wait = 1.0
    lease_ttl = 2

    def __init__(self, median_ns: float, freeze: threading.Event | None = None) -> None:
        super().__init__("cpu")
        self.median_ns = median_ns
        self.freeze = freeze
        self.loop: asyncio.AbstractEventLoop | None = None
        self.timing = threading.Event()

    async def setup(self, nc: Client, ref: ActorRef) -> None:
        self.loop = asyncio.get_running_loop()
        await self._join(nc, ref)

    def _time(
        self,
        builds: TimingBuilds[Any],
        problem: Problem,
        dtype: str,
        shape: dict[str, int] | None,
        windows: TimingWindows,
        call_seconds: float | None,
    ) -> tuple[HostCalibration, BenchmarkResult | Rejection]:
        windows.open()  # set up at once: the window opens, as a back end opens it
        self.timing.set()
        if self.freeze is not None and self.loop is not None:
            thawed = self.freeze
            self.loop.call_soon_threadsafe(lambda: thawed.wait(120))
            thawed.wait(120)
            time.sleep(0.5)  # its loop wakes: the renewal that finds the lease gone runs
        windows.close()
        ns = self.median_ns
        return CALIBRATION, BenchmarkResult(
            problem=problem.name,
            target="cpu",
            shape=shape or {},
            kernel=_stats(ns),
            baseline=_stats(10 * ns),
            baseline_name="numpy float32",
            incumbent=None,
            speedup=10.0,
            speedup_vs_incumbent=None,
            roofline_ns=1.0,
            roofline_fraction=1.0 / ns,
            input_sets=2,
            rotated_bytes=1,
            timed_seconds=0.1,
            host_contention_cores=0.0,
        )


def _run_in_own_loop(actor: StandInBenchmarker, url: str, stop: threading.Event) -> None:
    """One benchmarker process, as far as its event loop goes."""

    async def main() -> None:
        nc = await connect(url, "kf-benchmarker")
        halt = asyncio.Event()
        running = asyncio.create_task(ActorRuntime(actor, nc, "benchmarker-frozen").run(halt))
        while not stop.is_set():
            await asyncio.sleep(0.1)
        halt.set()
        await asyncio.wait_for(running, 60)
        await nc.close()

    asyncio.run(main())


def _outcomes(hub: Hub, candidate: str) -> list[list[object]]:
    return hub.store.query(
        "SELECT event_id, actor_instance, payload->>'median_ns' FROM events "
        f"WHERE type = 'BenchmarkCompleted' AND payload->>'candidate_id' = '{candidate}'"
    ).rows


async def _first_outcome(hub: Hub, candidate: str) -> list[list[object]]:
    deadline = time.monotonic() + 120
    while not (found := _outcomes(hub, candidate)) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return found


@pytest.mark.asyncio
async def test_a_benchmarker_presumed_dead_is_replaced_and_its_late_result_counted_once(
    hub: Hub,
) -> None:
    log = load_log(TWO_GENERATIONS)
    started = next(e for e in log if isinstance(e, CampaignStarted))
    opened = next(e for e in log if isinstance(e, GenerationOpened))
    proposal = next(e for e in log if isinstance(e, CandidateProposed))
    written = next(e for e in log if isinstance(e, KernelWritten))
    verified = new_event(
        KernelVerified,
        campaign_id=written.campaign_id,
        actor=VERIFIER,
        cause=written,
        source_hash=written.source_hash,
        max_rel_err=0.0,
        trials=1,
        **written.work(),
    )
    thaw, stop_frozen = threading.Event(), threading.Event()
    frozen = StandInBenchmarker(median_ns=2_000.0, freeze=thaw)
    other = threading.Thread(target=_run_in_own_loop, args=(frozen, hub.url, stop_frozen))
    other.start()
    nc = await connect(hub.url, "kf-benchmarker")
    stop = asyncio.Event()
    survivor = ActorRuntime(StandInBenchmarker(median_ns=1_000.0), nc, "benchmarker-alive")
    surviving: asyncio.Task[None] | None = None
    published: list[str] = []  # every BenchmarkCompleted sent, kept by the bus or not

    async def seen(message: Msg) -> None:
        published.append(decode(message.data).actor.instance)

    watching = await nc.subscribe(f"kf.ev.{written.campaign_id}.BenchmarkCompleted.>", cb=seen)
    try:
        calibrated = new_event(  # what the real benchmarker's setup records first
            HostCalibrated,
            campaign_id=SYSTEM_CAMPAIGN,
            actor=ActorRef("benchmarker", "benchmarker-t", "test"),
            device=CALIBRATION.host,
            bandwidth_gbs=1.0,
            peak_gflops=1.0,
        )
        await Emitter(jetstream(hub.nc)).emit_many(
            [calibrated, started, opened, proposal, written, verified]
        )
        assert await asyncio.to_thread(frozen.timing.wait, 120), "the first never timed"
        surviving = asyncio.create_task(survivor.run(stop))  # its job comes back to this one

        found = await _first_outcome(hub, proposal.candidate_id)
        assert [row[1:] for row in found] == [["benchmarker-alive", "1000.0"]]
        evidence = hub.store.query(
            "SELECT payload->'evidence'->'lease'->>'token' FROM events "
            "WHERE type = 'BenchmarkCompleted'"
        ).rows
        assert int(str(evidence[0][0])) > 0

        thaw.set()  # it wakes, finds its lease gone: it publishes nothing
        await asyncio.sleep(3)
        assert published == ["benchmarker-alive"]
        assert len(_outcomes(hub, proposal.candidate_id)) == 1

        # A late answer from it nonetheless (cut off from the KV, not from the bus): the
        # same cause-derived event id, within the bus's duplicate window and after it.
        frozen_ref = ActorRef("benchmarker", "benchmarker-frozen", "test")
        late = Reactions(verified, frozen_ref, id_key(nc))  # the role's key, as any instance
        result = late.emit(
            BenchmarkCompleted,
            median_ns=2_000.0,
            iqr_ns=0.0,
            baseline="numpy float32",
            baseline_ns=20_000.0,
            speedup=10.0,
            roofline_fraction=0.0005,
            device="stand-in",
            source_hash=verified.source_hash,
            **verified.work(),
        )
        assert result.event_id == found[0][0]
        await Emitter(jetstream(hub.nc)).emit(result)
        subject, data, _ = outgoing(result)
        ack = await jetstream(hub.nc).publish(subject, data)  # no Nats-Msg-Id: as if the
        # bus's duplicate window had passed; the store still holds the id once
        assert ack.seq > 0
        await asyncio.sleep(2)
        assert [row[1:] for row in _outcomes(hub, proposal.candidate_id)] == [
            ["benchmarker-alive", "1000.0"]
        ]
        history = History()
        for position, event in hub.store.replay(written.campaign_id):
            history.apply(position, event)
        benchmark = history.candidates[proposal.candidate_id].benchmark
        assert benchmark is not None and benchmark.median_ns == 1_000.0
        assert benchmark.actor.instance == "benchmarker-alive"
    finally:
        await watching.unsubscribe()
        thaw.set()
        stop_frozen.set()
        stop.set()
        if surviving is not None:
            await asyncio.wait_for(surviving, 60)
        await asyncio.to_thread(other.join, 60)
        await nc.close()


@pytest.mark.asyncio
async def test_a_verifier_waits_out_a_timed_window_on_its_host(hub: Hub) -> None:
    """Verification never runs while a benchmarker times on the same device: the verifier
    says whose window it waits for, and verifies once the window is over."""
    written = next(e for e in load_log(TWO_GENERATIONS) if isinstance(e, KernelWritten))
    nc = await connect(hub.url, "kf-verifier")
    benchmarker = await DeviceLeases.open(jetstream(hub.nc), "benchmarker-9")
    device = device_key("cpu", socket.gethostname(), worker_device_index("cpu"))
    window = await benchmarker.leases.try_acquire(f"{device}.timing", "benchmarker-9")
    assert window is not None
    stop = asyncio.Event()
    verifier = ActorRuntime(Verifier("cpu"), nc, "verifier-3")
    running = asyncio.create_task(verifier.run(stop))
    waiting = f"waiting for benchmarker-9's timed window on {device}"
    try:
        await Emitter(jetstream(hub.nc)).emit(written)
        deadline = time.monotonic() + 60
        while verifier.heartbeat().state != waiting:
            assert time.monotonic() < deadline, verifier.heartbeat().state
            await asyncio.sleep(0.05)
        window = await benchmarker.leases.renew(window)
        await asyncio.sleep(1.0)
        verdicts = "SELECT type FROM events WHERE type IN ('KernelVerified', 'KernelRejected')"
        assert hub.store.query(verdicts).rows == []
        assert verifier.heartbeat().state == waiting
        assert await benchmarker.leases.release(window)
        deadline = time.monotonic() + 120
        while not (found := hub.store.query(verdicts).rows):
            assert time.monotonic() < deadline, "never verified"
            await asyncio.sleep(0.1)
        assert found == [["KernelVerified"]]
    finally:
        stop.set()
        await asyncio.wait_for(running, 60)
        await nc.close()
