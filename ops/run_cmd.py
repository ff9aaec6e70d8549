"""`kfactory run`: a campaign, from a file or from flags.

On the embedded defaults it starts the hub (nats-server, recorder, SQL service) and
the roles of its target in this process; with --nats it submits the campaign to a running swarm
instead. It shows progress until the campaign finishes, then a leaderboard. Running the
same command again resumes the campaign from its history.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from actors.best_kernels import describe, file_name, ranked, write_kernel
from actors.campaign import Budget, CampaignError, CampaignSpec, Search, load_campaign, validate
from actors.history import History
from actors.planner import summary
from actors.ranking import campaign_baseline, speedup_over
from bus.auth import ClientAuth
from bus.connection import connect, jetstream
from bus.follow import Msg, follow
from bus.subjects import campaign_filter
from eventstore.authority import CLI
from eventstore.codec import InvalidEvent, decode
from eventstore.emitter import Emitter
from eventstore.events import ActorRef, CampaignResumed, CampaignStarted, Event, new_event
from eventstore.queries import replay
from kernels.loading import ProblemLoadError, load_problem
from ops.errors import UserError
from ops.home import client_auth_for, nats_url, resolve_home, running_server
from ops.hub import running_hub
from ops.logging import quiet_logs
from ops.options import CREDS, HOME, JSON, NATS, TLS_CA
from ops.output import to_json
from ops.swarm import Swarm, running_swarm

RUN_HELP = (
    "Run a campaign: search for the fastest correct kernel of a problem.\n\n"
    "With no --nats, everything runs here: an embedded nats-server, the recorder owning "
    "--home/events.duckdb, and the actors (planner, kernel-writer, fuser, verifier, "
    "benchmarker, librarian; and the compiler for cuda). A cuda campaign on a host without "
    "a GPU compiles and checks its kernels here, then waits for a GPU host's verifier and "
    "benchmarker to join the bus. With --nats (or a `kfactory server` running for --home) the "
    "campaign is handed to that swarm and followed from here.\n\n"
    "The same command run again resumes the campaign from its history: no candidate is "
    "evaluated twice. Ctrl-C stops cleanly.\n\n"
    "A campaign file (TOML), every field but problem optional:\n\n"
    '  name = "softmax-demo"   problem = "softmax" (or "ops.py:NAME")   target = "cpu"\n\n'
    '  dtype = "fp32" (cuda also takes "bf16" and "fp16")\n\n'
    "  shapes = [[4096, 4096]]   (the first is timed; default: the problem's)\n\n"
    '  \\[budget] candidates = 40, wall_time = "30m", stop_at_roofline = 0.95\n\n'
    "  \\[search] per_generation = 8, seed = 1\n\n"
    '  \\[writer] kind = "template", or "llm" with base_url, model, api_key_env\n\n'
    "Examples:\n\n"
    "  kfactory run campaigns/demo.toml\n\n"
    "  kfactory run --problem rmsnorm --budget 24 --json\n\n"
    "  kfactory run campaigns/demo.toml --nats nats://hub:4222"
)


def register(app: typer.Typer) -> None:
    app.command("run", help=RUN_HELP)(run)


def run(
    campaign_file: Path | None = typer.Argument(
        None, metavar="[CAMPAIGN.toml]", help="The campaign file; or use --problem."
    ),
    problem: str | None = typer.Option(None, help="Problem, when no campaign file is given."),
    target: str = typer.Option("cpu", help="Device target: cpu or cuda (no file)."),
    dtype: str = typer.Option("fp32", help="Element type: fp32, bf16 or fp16 (no file)."),
    budget: int = typer.Option(40, min=1, help="Candidates to evaluate at most (no file)."),
    per_generation: int = typer.Option(8, min=1, help="Candidates per generation (no file)."),
    seed: int = typer.Option(1, help="Search seed (no file)."),
    verifiers: int = typer.Option(1, min=1, help="Verifier actors to run here."),
    benchmarkers: int = typer.Option(1, min=1, help="Benchmarker actors to run here."),
    home: Path | None = HOME,
    nats: str | None = NATS,
    creds: Path | None = CREDS,
    tls_ca: Path | None = TLS_CA,
    as_json: bool = JSON,
) -> None:
    spec = _spec(campaign_file, problem, target, dtype, budget, per_generation, seed)
    folder = resolve_home(home)
    url = nats_url(nats, folder)
    if url is None and running_server(folder) is not None:
        raise UserError(f"a server already owns {folder}")
    auth = client_auth_for(folder, "cli", creds, tls_ca) if url is not None else None
    quiet_logs()
    console = Console(stderr=True, quiet=as_json)
    outcome = asyncio.run(_main(spec, folder, url, auth, verifiers, benchmarkers, console))
    if outcome is None:
        console.print("stopped; run the same command again to resume")
        raise typer.Exit(130)
    if as_json:
        print(to_json(outcome))


def _spec(
    path: Path | None,
    problem: str | None,
    target: str,
    dtype: str,
    budget: int,
    per_gen: int,
    seed: int,
) -> CampaignSpec:
    try:
        if path is not None:
            spec = load_campaign(path)
        elif problem is None:
            raise UserError("give a campaign file, or --problem NAME (see --help)")
        else:
            spec = validate(
                CampaignSpec(
                    problem=problem,
                    target=target,
                    dtype=dtype,
                    budget=Budget(candidates=budget),
                    search=Search(per_generation=per_gen, seed=seed),
                )
            )
        loaded = load_problem(spec.problem)
    except (CampaignError, ProblemLoadError) as exc:
        raise UserError(str(exc)) from None
    for shape in spec.shapes:
        if len(shape) != len(loaded.dims):
            raise UserError(f"shapes: {shape} does not give the dims {', '.join(loaded.dims)}")
    if spec.dtype not in loaded.dtypes:
        raise UserError(f"dtype {spec.dtype!r}: {loaded.name} is defined for {loaded.dtypes}")
    return spec


async def _main(
    spec: CampaignSpec,
    home: Path,
    url: str | None,
    auth: ClientAuth | None,
    verifiers: int,
    benchmarkers: int,
    console: Console,
) -> dict[str, Any] | None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if url is not None:
        return await follow_campaign(
            spec, url, auth or ClientAuth(), None, stop, console, best_dir=home / "best"
        )
    async with running_hub(home) as hub:
        console.print(f"hub {hub.url}; events in {hub.store.path}")
        async with running_swarm(
            hub.url,
            target=spec.target,
            verifiers=verifiers,
            benchmarkers=benchmarkers,
            auth=hub.auth,
        ) as swarm:
            if swarm.device_missing is not None:
                console.print(
                    f"no {spec.target} device here ({swarm.device_missing}): kernels are "
                    "compiled and checked here, then wait for a device host to join the bus. "
                    "For that, run the hub where the device host reaches it (`kfactory server "
                    "--listen 0.0.0.0`, then this command with --nats), and on the device "
                    f"host:\n  kfactory actor verifier --target {spec.target} --nats URL\n"
                    f"  kfactory actor benchmarker --target {spec.target} --nats URL"
                )
            return await follow_campaign(
                spec,
                hub.url,
                hub.auth("cli"),
                swarm,
                stop,
                console,
                hub.check,
                best_dir=home / "best",
            )


async def follow_campaign(
    spec: CampaignSpec,
    url: str,
    auth: ClientAuth,
    swarm: Swarm | None,
    stop: asyncio.Event,
    console: Console,
    hub_check: Callable[[], None] | None = None,
    best_dir: Path | None = None,
) -> dict[str, Any] | None:
    nc = await connect(url, "kfactory-run", auth=auth)
    try:
        history = History()
        campaign_id = spec.campaign_id
        for position, event in await replay(nc, campaign_id=campaign_id):
            history.apply(position, event)
        known = history.campaigns.get(campaign_id)
        if known is not None and known.finished is not None:
            console.print(f"campaign {campaign_id} already finished: {known.finished.reason}")
            return _result(history, campaign_id, console, best_dir)
        progress = Progress(history, campaign_id)
        subscription = await follow(nc, campaign_filter(campaign_id), progress.on_message)
        actor = ActorRef.here(CLI)
        start: Event
        if known is None:
            start = new_event(
                CampaignStarted,
                campaign_id=campaign_id,
                actor=actor,
                name=campaign_id,
                problem=spec.problem,
                target=spec.target,
                config=spec.to_config(),
            )
            console.print(f"campaign {campaign_id}: {spec.problem} ({spec.dtype}) on {spec.target}")
        else:
            start = new_event(CampaignResumed, campaign_id=campaign_id, actor=actor)
            console.print(f"campaign {campaign_id}: resuming from its history")
        await Emitter(jetstream(nc)).emit(start)
        with Live(progress.table(), console=console, refresh_per_second=4, transient=True) as live:
            while not progress.finished and not stop.is_set():
                if swarm is not None:
                    swarm.check()
                if hub_check is not None:
                    hub_check()
                live.update(progress.table())
                await asyncio.sleep(0.25)
        await subscription.stop()
        if not progress.finished:
            return None
        return _result(progress.history, campaign_id, console, best_dir)
    finally:
        await nc.close()


class Progress:
    """The campaign's events as they arrive, applied to a history of its own."""

    def __init__(self, history: History, campaign_id: str) -> None:
        self.history = history
        self.campaign_id = campaign_id
        self.started = time.monotonic()

    async def on_message(self, message: Msg) -> None:
        try:
            event = decode(message.data)
        except InvalidEvent:
            return
        self.history.apply(self.history.position + 1, event)

    @property
    def finished(self) -> bool:
        campaign = self.history.campaigns.get(self.campaign_id)
        return campaign is not None and campaign.finished is not None

    def table(self) -> Table:
        table = Table(title=f"campaign {self.campaign_id}", show_header=False)
        campaign = self.history.campaigns.get(self.campaign_id)
        if campaign is None:
            table.add_row("starting", "")
            return table
        candidates = self.history.campaign_candidates(self.campaign_id)
        best = self.history.best(self.campaign_id)
        table.add_row("generation", str(max(campaign.generations, default=0)))
        table.add_row(
            "candidates settled",
            f"{sum(c.settled for c in candidates)} of {len(candidates)} proposed "
            f"(budget {campaign.spec.budget.candidates})",
        )
        waiting = sum(c.waiting_for_device for c in candidates)
        if waiting:
            table.add_row(
                "waiting for the device",
                f"{waiting} compiled and checked, not yet run on a {campaign.spec.target} worker",
            )
        table.add_row("best speedup", f"{best.speedup:.2f}x" if best and best.speedup else "-")
        rejected = self.history.rejections_by_stage(self.campaign_id)
        table.add_row(
            "rejected by stage", ", ".join(f"{k} {v}" for k, v in rejected.items()) or "-"
        )
        table.add_row("elapsed", f"{time.monotonic() - self.started:.0f} s")
        return table


def _result(
    history: History, campaign_id: str, console: Console, best_dir: Path | None = None
) -> dict[str, Any]:
    campaign = history.campaigns[campaign_id]
    result = {"campaign_id": campaign_id, **summary(history, campaign)}
    winner = history.best(campaign_id)
    if best_dir is not None and winner is not None and winner.written and result["best"]:
        # The winning kernel as a file `kfactory check` and a compiler take as it is.
        path = write_kernel(winner, best_dir / file_name(winner))
        result["best"] = {**result["best"], **describe(winner, path)}
        console.print(f"best kernel written to {path}")
    if campaign.finished is not None:
        result["finished"] = campaign.finished.reason
    timed = ranked(history, campaign_id)  # the best, then by own median time
    baseline = campaign_baseline(history.campaign_candidates(campaign_id))
    board = Table(title=f"leaderboard: {campaign_id}")
    for column in ("rank", "candidate", "template", "params", "median ms", "IQR ms", "speedup"):
        board.add_column(column)
    board.add_column("roofline")
    for rank, c in enumerate(timed[:10], 1):
        assert c.benchmark is not None
        board.add_row(
            str(rank),
            c.candidate_id.rsplit(":", 2)[-2] + ":" + c.candidate_id.rsplit(":", 1)[-1],
            c.proposal.template,
            " ".join(f"{k}={v}" for k, v in c.proposal.params.items()),
            f"{c.benchmark.median_ns / 1e6:.3f}",
            f"{c.benchmark.iqr_ns / 1e6:.3f}",
            f"{speedup_over(c, baseline) or c.benchmark.speedup:.2f}x",
            f"{c.benchmark.roofline_fraction:.0%}",
        )
    console.print(board)
    if baseline is not None:
        console.print(f"campaign baseline: {baseline.words()}")
    console.print(
        f"evaluated {result['evaluated']}, duplicates avoided {result['duplicates_avoided']}, "
        f"rejected by stage {result['rejected_by_stage'] or '{}'}"
        + (f"; finished: {campaign.finished.reason}" if campaign.finished else "")
    )
    if sys.stderr.isatty():
        console.print(
            f'inspect: kfactory sql "SELECT type, count(*) FROM events '
            f"WHERE campaign_id = '{campaign_id}' GROUP BY type\""
        )
    return result
