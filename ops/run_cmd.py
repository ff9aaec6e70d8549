"""`kfactory run`: the main job on the embedded defaults.

Until the swarm lands (issue #4), a run is a one-kernel campaign recorded end to end:
the hub starts (embedded nats-server, recorder, SQL service), the campaign's facts are
published as events (host calibration, the verdict on the problem's example kernel and
its timing against numpy), and the campaign is read back with SQL and its hash chain
checked.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer

from bus.connection import connect, jetstream
from eventstore.emitter import Emitter
from eventstore.events import (
    ActorRef,
    BenchmarkCompleted,
    CampaignFinished,
    CampaignStarted,
    Event,
    HostCalibrated,
    KernelRejected,
    KernelVerified,
    new_event,
)
from gpu_workers.benchmarker import benchmark
from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.cpu.calibrate import load_or_calibrate
from gpu_workers.cpu.compiler import default_cache_dir
from gpu_workers.results import BenchmarkResult, Rejection
from gpu_workers.verifier import verify
from kernels.loading import ProblemLoadError, load_problem
from kernels.templates import example_kernel
from ops.errors import UserError
from ops.home import resolve_home, running_server
from ops.hub import Hub, running_hub
from ops.logging import quiet_logs
from ops.options import HOME, JSON
from ops.output import print_rows, to_json


def register(app: typer.Typer) -> None:
    app.command(
        "run",
        help=(
            "Run a campaign on this machine with everything embedded: nats-server, the "
            "recorder and DuckDB under --home. Today a campaign verifies and times the "
            "problem's example kernel against numpy and records every step as an event; "
            "the searching swarm arrives with issue #4.\n\n"
            "Examples:\n\n"
            "  kfactory run\n\n"
            "  kfactory run --problem rmsnorm --json"
        ),
    )(run)


def run(
    problem: str = typer.Option("softmax", help="A built-in problem (see `kfactory problems`)."),
    home: Path | None = HOME,
    as_json: bool = JSON,
) -> None:
    folder = resolve_home(home)
    if running_server(folder) is not None:
        raise UserError(f"a server already owns {folder}; stop it or use another --home")
    try:
        spec = load_problem(problem)
    except ProblemLoadError as exc:
        raise UserError(str(exc)) from None
    kernel = example_kernel(spec.name)
    if kernel is None:
        raise UserError(f"{spec.name} has no example kernel for the cpu target")
    quiet_logs()
    summary = asyncio.run(_campaign(folder, spec.name, kernel.source, kernel.flags, as_json))
    if as_json:
        print(to_json(summary))


async def _campaign(
    home: Path, problem_name: str, source: str, flags: tuple[str, ...], as_json: bool
) -> dict[str, Any]:
    def say(line: str) -> None:
        if not as_json:
            typer.echo(line, err=True)

    campaign = f"{problem_name}-{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
    actor = ActorRef.here("cli")
    spec = load_problem(problem_name)
    async with running_hub(home) as hub:
        say(f"hub: {hub.url}, store {hub.store.path}")
        nc = await connect(hub.url, "kfactory-run")
        emitter = Emitter(jetstream(nc))
        start = new_event(
            CampaignStarted,
            campaign_id=campaign,
            actor=actor,
            name=campaign,
            problem=problem_name,
            target="cpu",
            config={"kernel": "example", "flags": list(flags)},
        )
        events: list[Event] = [start]

        def fact(cls: type[Event], **payload: Any) -> Event:
            event = new_event(cls, campaign_id=campaign, actor=actor, cause=start, **payload)
            events.append(event)
            return event

        await emitter.emit(start)
        say("calibrating this host (cached after the first run) ...")
        calibration = await asyncio.to_thread(load_or_calibrate, default_cache_dir().parent)
        await emitter.emit(
            fact(
                HostCalibrated,
                device="cpu",
                bandwidth_gbs=calibration.memory_bandwidth_gbs,
                peak_gflops=calibration.peak_fp32_gflops,
                method={"host": calibration.host, "cpu": calibration.cpu_model},
            )
        )
        say(f"verifying the example {problem_name} kernel in the sandbox ...")
        backend = CpuBackend(cache_dir=default_cache_dir())
        verdict = await asyncio.to_thread(verify, spec, backend, source, flags)
        outcome: BenchmarkResult | Rejection | None = verdict.rejection
        if verdict.verified:
            await emitter.emit(
                fact(
                    KernelVerified,
                    problem=problem_name,
                    target="cpu",
                    candidate_id="example",
                    generation=0,
                    source_hash=verdict.source_sha256,
                    max_rel_err=verdict.max_rel_err or 0.0,
                    trials=len(verdict.trials),
                )
            )
            say("timing it against numpy ...")
            build = backend.compile(spec, source, flags).build
            outcome = await asyncio.to_thread(benchmark, spec, backend, build, calibration)
        if isinstance(outcome, Rejection):
            await emitter.emit(
                fact(
                    KernelRejected,
                    problem=problem_name,
                    target="cpu",
                    candidate_id="example",
                    generation=0,
                    source_hash=verdict.source_sha256,
                    stage=outcome.stage,
                    reason=outcome.reason,
                    evidence={"message": outcome.message, **outcome.evidence},
                )
            )
        elif isinstance(outcome, BenchmarkResult):
            await emitter.emit(
                fact(
                    BenchmarkCompleted,
                    problem=problem_name,
                    target="cpu",
                    candidate_id="example",
                    generation=0,
                    source_hash=verdict.source_sha256,
                    median_ns=outcome.kernel.median_ns,
                    iqr_ns=outcome.kernel.iqr_ns,
                    baseline="numpy float32",
                    baseline_ns=outcome.baseline.median_ns,
                    speedup=outcome.speedup,
                    roofline_fraction=outcome.roofline_fraction,
                    evidence={"shape": outcome.shape, "runs": outcome.kernel.runs},
                )
            )
        await emitter.emit(
            fact(CampaignFinished, reason="the example kernel was evaluated", summary={})
        )
        await nc.close()
        deadline = time.monotonic() + 60
        while not _recorded(hub, campaign, len(events)):
            hub.check()
            if time.monotonic() > deadline:
                raise RuntimeError("the recorder did not store the campaign's events in 60 s")
            await asyncio.sleep(0.05)
        rows = hub.store.query(
            "SELECT position, type, actor_role AS actor, "
            "coalesce(payload->>'reason', payload->>'speedup', payload->>'bandwidth_gbs', "
            "payload->>'problem') AS detail FROM events "
            f"WHERE campaign_id = '{campaign}' ORDER BY position"
        )
        chain = hub.store.verify_chain(campaign)
    best = outcome if isinstance(outcome, BenchmarkResult) else None
    summary = {
        "campaign_id": campaign,
        "events": len(rows.rows),
        "chain_ok": chain.ok,
        "verdict": "verified" if verdict.verified and best else "rejected",
        "speedup": best.speedup if best else None,
        "roofline_fraction": best.roofline_fraction if best else None,
        "median_ns": best.kernel.median_ns if best else None,
        "store": str(home / "events.duckdb"),
    }
    if not as_json:
        print_rows(rows.columns, rows.rows, "table", title=f"campaign {campaign}")
        if best:
            say(
                f"{problem_name}: {best.kernel.median_ns / 1e6:.2f} ms, "
                f"{best.speedup:.1f}x numpy, {best.roofline_fraction:.0%} of the roofline"
            )
        say(f"hash chain: {'intact' if chain.ok else chain.detail} ({chain.events_checked} events)")
        say(f"query it: kfactory sql \"SELECT * FROM events WHERE campaign_id = '{campaign}'\"")
    return summary


def _recorded(hub: Hub, campaign: str, count: int) -> bool:
    found = hub.store.query(f"SELECT count(*) FROM events WHERE campaign_id = '{campaign}'")
    return bool(found.rows[0][0] >= count)
