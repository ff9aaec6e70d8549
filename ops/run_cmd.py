"""`kfactory run`: a campaign, from a file or from flags.

On the embedded defaults it starts the hub (nats-server, recorder, SQL service) and
the roles of its target in this process (`ops/swarm.py`); with --nats (or a `kfactory
server` running for its run folder) it hands the campaign to a running swarm instead:
it first asks who is live (heartbeats), names the roles the campaign needs that have no
live instance, and starts them here unless `--no-local-actors`. It records
CampaignStarted, or CampaignResumed when the campaign is already in the store: running
the same command again resumes it.

While it follows the campaign it shows progress on stderr (`ops/progress.py`). When a
needed role has not been heard from for `bus.heartbeat.LIVE_FOR` (15 s) it warns and
records `CampaignStalled(kind="no_live_actor", role=...)`, once until the role is back: a
warning that does not stop the campaign. A blocking stall the planner or librarian records
(`no_design_space`, `dead_lettered`) ends the run: it prints `campaign stalled (KIND):
DETAIL` on stderr (with --json too) and exits `STALLED` (3); running it again resumes,
and the planner tries again. Otherwise the leaderboard and summary (or, with --json, one
JSON object) go to stdout once the campaign finishes, and the winner is written to
`<home>/best/`. A stop (SIGINT/SIGTERM) leaves the campaign to resume and exits 130.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from bisect import bisect_left
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from actors.campaign.campaign_file import (
    Budget,
    CampaignError,
    CampaignSpec,
    Search,
    Seed,
    load_campaign,
    validate,
    with_overrides,
)
from actors.campaign.history import History
from actors.campaign.leaderboard import Leaderboard, campaign_leaderboard
from actors.campaign.ranking import best_of, short_id
from actors.campaign.summary import summary
from actors.records.best_kernels import describe, file_name, write_kernel
from actors.search.evolve_strategy import NOTHING_TO_START
from actors.search.lineage import lineage_of
from actors.search.registry import strategy_for
from actors.search.spaces import design_spaces
from bus.auth import AuthError, ClientAuth
from bus.connection import INTERACTIVE_WAIT, connect, jetstream
from bus.follow import follow
from bus.heartbeat import collect, watch
from bus.subjects import campaign_filter
from eventstore.authority import CLI
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
from ops.home import client_auth_for, nats_url, resolve_home
from ops.hub import running_hub
from ops.lifecycle import STOPPED, run_command
from ops.logging import quiet_logs
from ops.options import CREDS, HOME, JSON, NATS, TLS_CA
from ops.output import console, to_json
from ops.progress import LINE_EVERY, LiveActors, Progress
from ops.swarm import Swarm, needed_roles, running_swarm

#: The exit status of a campaign that cannot go on (it said why).
STALLED = 3
#: Leaderboard rows printed unless `--top` says otherwise.
SHOWN = 10


def _stopped_words(campaign_id: str) -> str:
    """What a stopped run says: how to go on, and how to get an answer without going on."""
    return (
        "stopped; run the same command again to resume, or "
        f"`kfactory best {campaign_id} --final-run` for a final answer from the kernels "
        "timed so far"
    )


RUN_HELP = (
    "Run a campaign: search for the fastest correct kernel of a problem.\n\n"
    "With no --nats, everything runs here: an embedded nats-server, the recorder owning "
    "--home/events.duckdb, and the actors (planner, kernel-writer, fuser, verifier, "
    "benchmarker, librarian; and the compiler for cuda). A cuda campaign on a host without "
    "a GPU compiles and checks its kernels here, then waits for a GPU host's verifier and "
    "benchmarker to join the bus. With --nats (or a `kfactory server` running for --home) the "
    "campaign is handed to that swarm and followed from here; roles it lacks are named and "
    "started here, unless --no-local-actors.\n\n"
    "The leaderboard and summary (or --json) go to stdout; progress and diagnostics to "
    "stderr (a line every 10 s when stderr is not a terminal).\n\n"
    "The same command run again resumes the campaign from its history: no candidate is "
    "evaluated twice. Ctrl-C stops cleanly.\n\n"
    "A campaign file (TOML), every field but problem optional:\n\n"
    '  name = "softmax-demo"   problem = "softmax" (or "ops.py:NAME")   target = "cpu"\n\n'
    '  dtype = "fp32" (cuda also takes "bf16" and "fp16")\n\n'
    "  shapes = [[4096, 4096]]   (the first is timed; default: the problem's)\n\n"
    '  \\[budget] candidates = 40, wall_time = "30m" (active time), stop_at_roofline = 0.95\n\n'
    "  \\[search] per_generation = 8, seed = 1\n\n"
    '  \\[writer] kind = "template", "evolve" (variation operators on the seeds), or "llm" '
    "with base_url, model, api_key_env\n\n"
    '  \\[writer.agent] max_steps = 12, max_tokens = 200000, wall_time = "10m"   (the LLM '
    "agent operator of an evolve campaign whose writer has a base_url and model)\n\n"
    '  \\[seed] sources = ["my_kernel.c"]   (verified and timed first, then tuned)\n\n'
    '  \\[\\[spaces]] file = "k.c.j2" (or macro C "k.c"), params = {BLOCK = [8, 16]},\n'
    '  restrictions = ["BLOCK * UNROLL <= 64"]   (files relative to the campaign file)\n\n'
    "Examples:\n\n"
    "  kfactory run campaigns/demo.toml\n\n"
    "  kfactory run --problem rmsnorm --budget 24 --json\n\n"
    "  kfactory run --problem ops.py:NAME --seed-source kernel.c --writer evolve --budget 60\n\n"
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
    writer: str | None = typer.Option(
        None,
        help="What writes the kernels: template (the design spaces), evolve (offline "
        "variation operators on your C kernel: give --seed-source) or llm (overrides).",
    ),
    per_generation: int = typer.Option(8, min=1, help="Candidates per generation (no file)."),
    seed: int = typer.Option(1, help="Search seed (no file)."),
    seed_source: list[Path] = typer.Option(
        [], help="A kernel of yours that generation 0 verifies and times first (repeatable)."
    ),
    verifiers: int = typer.Option(1, min=1, help="Verifier actors to run here."),
    benchmarkers: int = typer.Option(
        2,
        min=1,
        help="Benchmarker actors to run here. Two by default: one builds, sets up and "
        "re-checks its kernel while the other times; the device's lease keeps their timed "
        "windows apart.",
    ),
    home: Path | None = HOME,
    nats: str | None = NATS,
    creds: Path | None = CREDS,
    tls_ca: Path | None = TLS_CA,
    as_json: bool = JSON,
    top: int = typer.Option(SHOWN, "--top", min=1, help="Leaderboard rows to print."),
    no_local_actors: bool = typer.Option(
        False,
        "--no-local-actors",
        help="In front of a running server, start no missing role here; only name them.",
    ),
) -> None:
    spec = _spec(campaign_file, problem, target, dtype, per_generation, seed)
    try:
        spec = with_overrides(
            spec, budget=budget, wall_time=wall_time, shapes=shapes, name=name, writer=writer
        )
    except CampaignError as exc:
        raise UserError(str(exc)) from None
    _check_problem(spec)
    spec = _with_seeds(spec, seed_source)
    folder = resolve_home(home)
    url = nats_url(nats, folder)
    auth = client_auth_for(folder, "cli", creds, tls_ca) if url is not None else None
    quiet_logs()
    settings = Settings(folder, verifiers, benchmarkers, as_json, not no_local_actors, tls_ca, top)
    try:
        code = run_command(
            lambda stop: _main(stop, spec, url, auth, settings),
            _stopped_words(spec.campaign_id),
        )
    except (ConnectionError, AuthError) as exc:
        raise UserError(str(exc)) from exc
    if code:
        raise typer.Exit(code)


@dataclass(frozen=True)
class Settings:
    home: Path
    verifiers: int
    benchmarkers: int
    as_json: bool
    local_actors: bool
    tls_ca: Path | None
    top: int = SHOWN


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
        starts = strategy_for(spec).first_points(spec)
    except SpaceError as exc:
        raise UserError(str(exc)) from None
    if spec.writer.kind == "evolve" and not starts:
        raise UserError(NOTHING_TO_START)
    return spec


async def _main(
    stop: asyncio.Event,
    spec: CampaignSpec,
    url: str | None,
    auth: ClientAuth | None,
    settings: Settings,
) -> int:
    """Run or follow the campaign, print its result; the exit status."""
    console = diagnostics()
    best_dir = settings.home / "best"
    async with joined_swarm(stop, spec.target, url, auth, settings) as joined:
        result = await follow_campaign(
            spec, joined.url, joined.auth, joined.swarm, stop, console, joined.hub_check, best_dir
        )
    if result is None:
        console.print(_stopped_words(spec.campaign_id), markup=False)
        if settings.as_json:
            print(to_json({"campaign_id": spec.campaign_id, "stopped": True}), flush=True)
        return STOPPED
    if settings.as_json:
        print(to_json(result), flush=True)
    else:
        _print_results(result, settings.top)
    if "stalled" in result:  # said even with --json: the one line a script needs
        stalled = result["stalled"]
        console.print(f"campaign stalled ({stalled['kind']}): {stalled['detail']}")
        return STALLED
    return 0


@dataclass(frozen=True)
class Joined:
    """Where a command reaches the swarm: the hub's URL, its own credentials there, the
    actors it started in this process (None: all were live), and the check of an embedded
    hub it started (None: it joined a running one)."""

    url: str
    auth: ClientAuth
    swarm: Swarm | None
    hub_check: Callable[[], None] | None = None


@contextlib.asynccontextmanager
async def joined_swarm(
    stop: asyncio.Event,
    target: str,
    url: str | None,
    auth: ClientAuth | None,
    settings: Settings,
    roles: Collection[str] | None = None,
) -> AsyncIterator[Joined]:
    """The swarm a campaign on `target` needs (`roles` of it; default every role it
    needs): with no `url`, the embedded hub and the actors, in this process; in front of a
    running swarm, the roles it lacks started here (unless told not to), named either way."""
    console = diagnostics()
    if url is None:
        async with running_hub(settings.home, stop=stop) as hub:
            console.print(f"hub {hub.url}; events in {hub.store.path}")
            async with running_swarm(
                hub.url,
                target=target,
                verifiers=settings.verifiers,
                benchmarkers=settings.benchmarkers,
                auth=hub.auth,
                only=roles,
            ) as swarm:
                if swarm.device_missing is not None:
                    console.print(
                        f"no {target} device here ({swarm.device_missing}): kernels are "
                        "compiled and checked here, then wait for a device host to join the "
                        "bus. For that, run the hub where the device host reaches it "
                        "(`kfactory server --listen 0.0.0.0`, then this command with --nats), "
                        "and on the device host:\n"
                        f"  kfactory actor verifier --target {target} --nats URL\n"
                        f"  kfactory actor benchmarker --target {target} --nats URL"
                    )
                yield Joined(hub.url, hub.auth("cli"), swarm, hub.check)
        return
    auth = auth or ClientAuth()
    missing = await _missing_roles(stop, target, url, auth, roles)
    if not missing:
        yield Joined(url, auth, None)
        return
    if not settings.local_actors:
        console.print(
            f"the swarm at {url} has no live {', '.join(missing)} (--no-local-actors): the "
            "campaign waits until they join, e.g. on a host with the credentials:\n"
            + "\n".join(
                f"  kfactory actor {role} --target {target} --nats {url}" for role in missing
            )
        )
        yield Joined(url, auth, None)
        return
    console.print(f"the swarm at {url} has no live {', '.join(missing)}: starting them here")

    def role_auth(role: str) -> ClientAuth:
        return client_auth_for(settings.home, role, None, settings.tls_ca)

    async with running_swarm(
        url,
        target=target,
        verifiers=settings.verifiers,
        benchmarkers=settings.benchmarkers,
        auth=role_auth,
        only=missing,
    ) as swarm:
        if swarm.device_missing is not None and {"verifier", "benchmarker"} & set(missing):
            console.print(
                f"no {target} device here ({swarm.device_missing}): the device's roles "
                "still have to join from a host that has it"
            )
        yield Joined(url, auth, swarm)


async def _missing_roles(
    stop: asyncio.Event,
    target: str,
    url: str,
    auth: ClientAuth,
    roles: Collection[str] | None,
) -> list[str]:
    """The roles (of `roles`, default all) a campaign on `target` needs that have no live
    instance on the swarm at `url`."""
    nc = await connect(url, "kfactory-run", wait_for_server=INTERACTIVE_WAIT, stop=stop, auth=auth)
    try:
        beats = await collect(nc)
    finally:
        await nc.close()
    live = {(beat.role, beat.target) for beat, _ in beats.values()}
    return [
        role
        for role, role_target in needed_roles(target)
        if (roles is None or role in roles)
        and not any(r == role and (role_target is None or t == role_target) for r, t in live)
    ]


def diagnostics() -> Console:
    """Where progress and diagnostics go: stderr, never wrapped mid-line."""
    return Console(stderr=True, soft_wrap=True, markup=False, highlight=False)


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
    """Start (or resume) the campaign and show its progress until it finishes; its
    result, or None if stopped first."""
    nc = await connect(url, "kfactory-run", wait_for_server=INTERACTIVE_WAIT, stop=stop, auth=auth)
    try:
        history = History()
        campaign_id = spec.campaign_id
        for position, event in await replay(nc, campaign_id=campaign_id):
            history.apply(position, event)
        known = history.campaigns.get(campaign_id)
        if known is not None and known.finished is not None:
            console.print(f"campaign {campaign_id} already finished: {known.finished.reason}")
            return _result(history, campaign_id, console, best_dir)
        progress = Progress(history, campaign_id, nc)
        subscription = await follow(nc, campaign_filter(campaign_id), progress.on_message)
        live = LiveActors(needed_roles(spec.target))
        stop_watching = await watch(nc, live.seen)
        actor = ActorRef.here(CLI)
        emitter = Emitter(jetstream(nc))
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
        await emitter.emit(start)
        terminal = console.is_terminal
        shown = Live(progress.table(), console=console, refresh_per_second=4) if terminal else None
        last_line = time.monotonic()
        with shown or contextlib.nullcontext():
            while not progress.finished and progress.stalled(start) is None and not stop.is_set():
                if swarm is not None:
                    swarm.check()
                if hub_check is not None:
                    hub_check()
                await _warn_missing(live, spec, url, console, emitter, actor)
                if shown is not None:
                    shown.update(progress.table())
                elif time.monotonic() - last_line >= LINE_EVERY:
                    console.print(progress.line())
                    last_line = time.monotonic()
                await asyncio.sleep(0.25)
        await stop_watching()
        await subscription.stop()
        stalled = progress.stalled(start)
        if stalled is not None:
            result = _result(progress.history, campaign_id, console, best_dir)
            return {**result, "stalled": {"kind": stalled.kind, "detail": stalled.detail}}
        if not progress.finished:
            return None
        if shown is None:
            console.print(progress.line())
        return _result(progress.history, campaign_id, console, best_dir)
    finally:
        await nc.close()


async def _warn_missing(
    live: LiveActors,
    spec: CampaignSpec,
    url: str,
    console: Console,
    emitter: Emitter,
    actor: ActorRef,
) -> None:
    """Say so (on screen and in a CampaignStalled event) when a role the campaign needs
    has had no live instance for a while, and when it is back."""
    gone, back = live.newly_missing()
    for role in gone:
        detail = (
            f"no live {role} for {spec.target} for {live.live_for:.0f} s: the campaign cannot "
            f"progress until one joins (kfactory actor {role} --target {spec.target} "
            f"--nats {url})"
        )
        console.print(f"warning: {detail}")
        await emitter.emit(
            new_event(
                CampaignStalled,
                campaign_id=spec.campaign_id,
                actor=actor,
                kind="no_live_actor",
                detail=detail,
                role=role,
            )
        )
    for role in back:
        console.print(f"a {role} is live again")


def _generations(history: History, campaign_id: str, board: Leaderboard) -> list[dict[str, Any]]:
    """Each generation's outcome, and the lessons of earlier ones that it searched with."""
    campaign = history.campaigns[campaign_id]
    rows: list[dict[str, Any]] = []
    drawn_in: dict[int, list[str]] = {}  # the statements of each generation's lessons
    for lesson in campaign.lessons:
        drawn_in.setdefault(lesson.generation, []).append(lesson.statement)
    drawn_at = sorted(lesson.generation for lesson in campaign.lessons)
    for number, generation in sorted(campaign.generations.items()):
        candidates = [history.candidates[c] for c in generation.candidates]
        best = best_of(candidates)
        rows.append(
            {
                "generation": number,
                "proposed": len(candidates),
                "settled": sum(c.settled for c in candidates),
                # the generation's best as its GenerationClosed names it, with its figure
                "best_speedup": board.speedup_of(best.candidate_id) or 0.0 if best else 0.0,
                "closed": generation.closed is not None,
                "lessons_used": bisect_left(drawn_at, number),
                "new_lessons": drawn_in.get(number - 1, []),
            }
        )
    return rows


def _result(
    history: History, campaign_id: str, console: Console, best_dir: Path | None = None
) -> dict[str, Any]:
    """The campaign's summary and its leaderboard (the best also written to a file)."""
    campaign = history.campaigns[campaign_id]
    result = {"campaign_id": campaign_id, **summary(history, campaign)}
    board = campaign_leaderboard(history, campaign_id)
    winner, baseline = board.best, board.baseline
    if best_dir is not None and winner is not None and result["best"]:
        # The winning kernel as a file `kfactory check` and a compiler take as it is.
        path = write_kernel(
            winner.candidate,
            best_dir / file_name(winner.candidate),
            lineage_of(history, winner.candidate),
        )
        result["best"] = {**result["best"], **describe(winner, path, baseline)}
        console.print(f"best kernel written to {path}")
    if campaign.finished is not None:
        result["finished"] = campaign.finished.reason
    result["by_generation"] = _generations(history, campaign_id, board)
    result["campaign_baseline"] = (
        {**baseline.as_dict(), "words": baseline.words()} if baseline else None
    )
    result["leaderboard"] = [
        {
            "rank": row.rank,
            "candidate": row.candidate_id,
            "template": row.template,
            "params": dict(row.params),
            "median_ms": row.median_ns / 1e6,
            "iqr_ms": row.iqr_ns / 1e6,
            "speedup": row.speedup,
            "pooled_median_ms": row.pooled_median_ns / 1e6,
            "runs": row.runs,
            "speedup_vs_campaign_baseline": row.speedup_vs_campaign_baseline,
            "roofline_fraction": row.roofline_fraction,
            "standing": row.standing,
            "decided_by": row.decided_by,
            "final_run": None
            if row.final is None
            else {
                "mean_ms": row.final.mean_ns / 1e6,
                "median_ms": row.final.median_ns / 1e6,
                "iqr_ms": row.final.iqr_ns / 1e6,
                "rounds": row.final.rounds,
            },
        }
        for row in board.rows
    ]
    return result


def _final_figure(final: dict[str, Any] | None) -> str:
    if final is None:
        return ""
    return f"{final['mean_ms']:.3f} ({final['iqr_ms']:.3f})"


def point(params: dict[str, Any]) -> str:
    """A point as `name=value` words, a value with spaces quoted: `flags='-O3 -march=native'`."""
    return " ".join(
        f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}" for k, v in params.items()
    )


def _print_results(result: dict[str, Any], top: int = SHOWN) -> None:
    """The leaderboard's `top` rows and the summary, on stdout (`kfactory run > out.txt`
    keeps them)."""
    out = console()
    campaign_id = result["campaign_id"]
    board = Table(title=f"leaderboard: {campaign_id}")
    for column in (
        "rank",
        "candidate",
        "template",
        "median ms",
        "IQR ms",
        "speedup",
        "roofline",
        "pooled ms (runs)",
        "final run mean ms (IQR)",
        "standing",
        "decided by",
    ):
        board.add_column(column)
    for row in result["leaderboard"][:top]:
        candidate = str(row["candidate"])
        board.add_row(
            str(row["rank"]),
            short_id(candidate),
            row["template"],
            f"{row['median_ms']:.3f}",
            f"{row['iqr_ms']:.3f}",
            f"{row['speedup']:.2f}x",
            f"{row['roofline_fraction']:.0%}",
            f"{row['pooled_median_ms']:.3f} ({row['runs']})",
            _final_figure(row["final_run"]),
            row["standing"],
            row["decided_by"],
        )
    for row in result["by_generation"]:
        if row["lessons_used"]:
            new = row["new_lessons"]
            out.print(
                f"generation {row['generation']} searched with {row['lessons_used']} lesson(s)"
                + (", these new:" if new else ", none new"),
                markup=False,
            )
            for statement in new:
                out.print(f"  - {statement}", markup=False, highlight=False)
        out.print(
            f"generation {row['generation']}: {row['settled']} of {row['proposed']} settled, "
            f"best {row['best_speedup']:.2f}x" + ("" if row["closed"] else " (not closed)"),
            markup=False,
        )
    out.print(board)
    if result["leaderboard"]:
        out.print("their points, in full:", markup=False)
        for row in result["leaderboard"][:top]:
            out.print(
                f"  {short_id(str(row['candidate']))} {row['template']}: {point(row['params'])}",
                markup=False,
                highlight=False,
            )
        out.print(
            "median, IQR and speedup (over the baseline timed in the same run) are each "
            "kernel's own timing run's. Rank 1 is the best: the last kernel promoted, by a "
            "head-to-head run against the best of its time; the others follow by their pooled "
            "time, the median over every run that timed the kernel (runs): its own, and each "
            "head-to-head run that timed it as the best. Once the search ended, its top "
            "kernels were timed together in one final run: its winner is rank 1, and its "
            "contenders come first, by that run's mean (decided by)",
            markup=False,
        )
    rows = len(result["leaderboard"])
    shown = min(top, rows)
    if shown < rows:
        out.print(f"{shown} of {rows} shown; `--top N` shows more", markup=False)
    if result["campaign_baseline"] is not None:
        out.print(f"campaign baseline: {result['campaign_baseline']['words']}", markup=False)
    finished = result.get("finished")
    out.print(
        f"evaluated {result['evaluated']}, duplicates avoided {result['duplicates_avoided']}, "
        f"rejected by stage {result['rejected_by_stage'] or '{}'}"
        + (f"; finished: {finished}" if finished else ""),
        markup=False,
        highlight=False,
    )
    if sys.stdout.isatty():
        out.print(
            f'inspect: kfactory sql "SELECT type, count(*) FROM events '
            f"WHERE campaign_id = '{campaign_id}' GROUP BY type\"",
            markup=False,
        )
