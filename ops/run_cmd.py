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

import msgspec
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from actors.best_kernels import describe, file_name, write_kernel
from actors.campaign import (
    Budget,
    CampaignError,
    CampaignSpec,
    Search,
    Seed,
    load_campaign,
    validate,
    with_overrides,
)
from actors.history import History
from actors.planner import summary
from actors.spaces import design_spaces
from bus.auth import ClientAuth
from bus.connection import connect, jetstream
from bus.follow import Msg, follow
from bus.subjects import campaign_filter
from eventstore.authority import CLI
from eventstore.codec import InvalidEvent, decode
from eventstore.emitter import Emitter
from eventstore.events import (
    ActorRef,
    CampaignResumed,
    CampaignStalled,
    CampaignStarted,
    Event,
    new_event,
)
from eventstore.queries import replay
from kernels.loading import ProblemLoadError, load_problem
from kernels.user_spaces import SpaceError
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
    '  \\[budget] candidates = 40, wall_time = "30m" (active time), stop_at_roofline = 0.95\n\n'
    "  \\[search] per_generation = 8, seed = 1\n\n"
    '  \\[writer] kind = "template", or "llm" with base_url, model, api_key_env\n\n'
    '  \\[seed] sources = ["my_kernel.c"]   (verified and timed first, then tuned)\n\n'
    '  \\[\\[spaces]] file = "k.c.j2" (or macro C "k.c"), params = {BLOCK = [8, 16]},\n'
    '  restrictions = ["BLOCK * UNROLL <= 64"]   (files relative to the campaign file)\n\n'
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
    budget: int | None = typer.Option(
        None, min=1, help="Candidates to evaluate at most (default 40; overrides the file)."
    ),
    wall_time: str | None = typer.Option(
        None, help="Active time at most, e.g. 90s or 30m (default 30m; overrides the file)."
    ),
    shapes: str | None = typer.Option(
        None, help="Shapes, e.g. 4096x4096 or 512x2048,64x64; the first is timed (overrides)."
    ),
    name: str | None = typer.Option(None, help="Campaign name (overrides the file)."),
    per_generation: int = typer.Option(8, min=1, help="Candidates per generation (no file)."),
    seed: int = typer.Option(1, help="Search seed (no file)."),
    seed_source: list[Path] = typer.Option(
        [], help="A kernel of yours that generation 0 verifies and times first (repeatable)."
    ),
    verifiers: int = typer.Option(1, min=1, help="Verifier actors to run here."),
    benchmarkers: int = typer.Option(1, min=1, help="Benchmarker actors to run here."),
    home: Path | None = HOME,
    nats: str | None = NATS,
    creds: Path | None = CREDS,
    tls_ca: Path | None = TLS_CA,
    as_json: bool = JSON,
) -> None:
    spec = _spec(campaign_file, problem, target, dtype, per_generation, seed)
    try:
        spec = with_overrides(spec, budget=budget, wall_time=wall_time, shapes=shapes, name=name)
    except CampaignError as exc:
        raise UserError(str(exc)) from None
    _check_problem(spec)
    spec = _with_seeds(spec, seed_source)
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
    if "stalled" in outcome:  # said even with --json: the one line a script needs
        stalled = outcome["stalled"]
        print(f"campaign stalled ({stalled['cause']}): {stalled['detail']}", file=sys.stderr)
        raise typer.Exit(3)


def _spec(
    path: Path | None,
    problem: str | None,
    target: str,
    dtype: str,
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
                    budget=Budget(),
                    search=Search(per_generation=per_gen, seed=seed),
                )
            )
    except CampaignError as exc:
        raise UserError(str(exc)) from None
    return spec


def _check_problem(spec: CampaignSpec) -> None:
    try:
        loaded = load_problem(spec.problem)
    except ProblemLoadError as exc:
        raise UserError(str(exc)) from None
    for shape in spec.shapes:
        if len(shape) != len(loaded.dims):
            raise UserError(f"shapes: {shape} does not give the dims {', '.join(loaded.dims)}")
        faults = loaded.shape_faults(dict(zip(loaded.dims, shape, strict=True)))
        if faults:
            raise UserError(f"shapes: {faults[0]}")
    if spec.dtype not in loaded.dtypes:
        raise UserError(f"dtype {spec.dtype!r}: {loaded.name} is defined for {loaded.dtypes}")


def _with_seeds(spec: CampaignSpec, sources: list[Path]) -> CampaignSpec:
    """The spec with the --seed-source kernels added, and its spaces checked now."""
    if sources:
        added = [str(p.resolve()) for p in sources]
        spec = msgspec.structs.replace(spec, seed=Seed(sources=[*spec.seed.sources, *added]))
    try:
        design_spaces(spec.problem, spec.target, spec.dtype, spec)
    except SpaceError as exc:
        raise UserError(str(exc)) from None
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
            while not progress.finished and not progress.stalled(start) and not stop.is_set():
                if swarm is not None:
                    swarm.check()
                if hub_check is not None:
                    hub_check()
                live.update(progress.table())
                await asyncio.sleep(0.25)
        await subscription.stop()
        stalled = progress.stalled(start)
        if stalled is not None:
            result = _result(progress.history, campaign_id, console, best_dir)
            return {**result, "stalled": {"cause": stalled.cause, "detail": stalled.detail}}
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

    def stalled(self, start: Event) -> CampaignStalled | None:
        """Why the campaign cannot go on, said after `start` (this run's start or resume)."""
        campaign = self.history.campaigns.get(self.campaign_id)
        if campaign is None or campaign.finished or start.event_id not in self.history.event_ids:
            return None
        return campaign.stalled

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


def _generations(history: History, campaign_id: str, console: Console) -> None:
    """Each generation's outcome, and the lessons of the one before that it searched with."""
    campaign = history.campaigns[campaign_id]
    for number, generation in sorted(campaign.generations.items()):
        used = [x for x in campaign.lessons if x.generation < number]
        new = [x for x in used if x.generation == number - 1]
        if used:
            console.print(
                f"generation {number} searched with {len(used)} lesson(s)"
                + (", these new:" if new else ", none new")
            )
            for lesson in new:
                console.print(f"  - {lesson.statement}")
        candidates = [history.candidates[c] for c in generation.candidates]
        best = max((c.speedup or 0.0 for c in candidates), default=0.0)
        console.print(
            f"generation {number}: {sum(c.settled for c in candidates)} of {len(candidates)} "
            f"settled, best {best:.2f}x" + ("" if generation.closed else " (not closed)")
        )


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
    timed = sorted(
        (c for c in history.campaign_candidates(campaign_id) if c.benchmark),
        key=lambda c: c.speedup or 0.0,
        reverse=True,
    )
    board = Table(title=f"leaderboard: {campaign_id}")
    for column in ("rank", "candidate", "template", "median ms", "speedup", "roofline"):
        board.add_column(column)
    for rank, c in enumerate(timed[:10], 1):
        assert c.benchmark is not None
        board.add_row(
            str(rank),
            c.candidate_id.rsplit(":", 2)[-2] + ":" + c.candidate_id.rsplit(":", 1)[-1],
            c.proposal.template,
            f"{c.benchmark.median_ns / 1e6:.3f}",
            f"{c.benchmark.speedup:.2f}x",
            f"{c.benchmark.roofline_fraction:.0%}",
        )
    _generations(history, campaign_id, console)
    console.print(board)
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
