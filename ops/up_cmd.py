"""`kfactory up --config swarm.toml` and `kfactory down`: a supervised multi-process swarm.

`up` runs the supervisor (`ops/supervisor.py`) in the foreground; `--detach` starts it in
a session of its own and returns once its state says every process has started (at most
`DETACH_WAIT` s), printing the hub's URL. Each process logs to `HOME/swarm/logs/`. One
swarm per run folder; without a URL, none beside a server that already owns the folder
(join that one with `--nats`). `down` stops the swarm (`stop_swarm`) and exits 1, naming
them, if processes had to be killed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import typer

from ops.errors import UserError
from ops.home import resolve_home, running_server
from ops.options import HOME
from ops.supervisor import (
    FIRST_DELAY,
    MAX_DELAY,
    STABLE_AFTER,
    Child,
    Supervisor,
    kfactory_argv,
    read_state,
    running,
    stop_swarm,
    swarm_dir,
)
from ops.swarm_file import SwarmFile, SwarmFileError, load_swarm

#: How long `up --detach` waits for every process to have started.
DETACH_WAIT = 120.0


def register(app: typer.Typer) -> None:
    app.command(
        "up",
        help=(
            "Start a swarm of actor processes on this host and keep it running: COUNT "
            "processes per role, as the swarm file says (see ops/deploy/swarm.toml). "
            "Without a NATS URL it first starts the hub here, as `kfactory server` does "
            "(embedded nats-server, recorder, SQL service), and the actors join it; with "
            "one (--nats, or `nats` in the file) they join that server or cluster.\n\n"
            f"A process that exits is started again after {FIRST_DELAY:g} s, doubling up to "
            f"{MAX_DELAY:g} s while it keeps exiting (reset once it has run {STABLE_AFTER:g} "
            "s); each restart is logged. Each process logs to HOME/swarm/logs/NAME.log; "
            "the pids are in HOME/swarm/state.json. SIGINT or SIGTERM stops the actors, "
            "then the hub.\n\n"
            "Examples:\n\n"
            "  kfactory up --config ops/deploy/swarm.toml             # foreground\n\n"
            "  kfactory up --config ops/deploy/swarm.toml --detach    # then: kfactory ps, "
            "kfactory down\n\n"
            "  kfactory up --config gpu.toml --nats tls://n1:4222,tls://n2:4222,tls://n3:4222 "
            "--detach   # a GPU host of a cluster"
        ),
    )(up)
    app.command(
        "down",
        help=(
            "Stop the swarm `kfactory up` runs for this run folder: SIGTERM to its "
            "supervisor, which stops the actors, then the hub, each within 2 s of its "
            "signal; whatever is still running after that is killed and named.\n\n"
            "Example:\n\n  kfactory down"
        ),
    )(down)


def up(
    config: Path = typer.Option(..., "--config", "-c", help="The swarm file (TOML)."),
    nats: str | None = typer.Option(
        None,
        "--nats",
        help="NATS URL(s) to join, comma-separated (overrides the file's `nats`); "
        "without one, the hub is started here.",
        show_default=False,
    ),
    detach: bool = typer.Option(
        False, "--detach", "-d", help="Run in the background; return once all have started."
    ),
    home: Path | None = HOME,
) -> None:
    folder = resolve_home(home).absolute()
    try:
        swarm = load_swarm(config)
    except SwarmFileError as exc:
        raise UserError(str(exc)) from exc
    url = nats or swarm.nats
    state = read_state(folder)
    if state is not None and running(state.pid):
        raise UserError(f"a swarm (pid {state.pid}) already runs in {folder}; `kfactory down`")
    if url is None and (other := running_server(folder)) is not None:
        raise UserError(
            f"a server (pid {other.pid}) already owns {folder}: pass --nats {other.url} "
            "to join it, or stop it"
        )
    if detach:
        _detach(config.absolute(), url, folder)
        return
    supervisor = _supervisor(swarm, config.absolute(), url, folder)
    stopping = False

    def stop(_signal: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    count = len(supervisor.children)
    typer.echo(f"kfactory up: {count} processes in {folder}; Ctrl-C stops them", err=True)
    supervisor.run(lambda: stopping)
    typer.echo("kfactory up: stopped", err=True)


def _supervisor(swarm: SwarmFile, config: Path, url: str | None, home: Path) -> Supervisor:
    logs = swarm_dir(home) / "logs"
    hub = None
    if url is None:
        hub = Child(
            "hub", lambda _url: kfactory_argv("server", "--home", str(home)), logs / "hub.log"
        )
    actors = []
    for group in swarm.actor:
        for index in range(1, group.count + 1):
            name = f"{group.role}-{group.target}-{index}"
            actors.append(
                Child(
                    name, _actor_argv(swarm, group.role, group.target, home), logs / f"{name}.log"
                )
            )
    return Supervisor(home, config, hub, actors, url)


def _actor_argv(
    swarm: SwarmFile, role: str, target: str, home: Path
) -> Callable[[str | None], list[str]]:
    def argv(url: str | None) -> list[str]:
        args = ["actor", role, "--target", target, "--home", str(home)]
        if url is not None:
            args += ["--nats", url]
        if swarm.creds is not None:
            args += ["--creds", str(Path(swarm.creds) / f"{role}.nk")]
        if swarm.tls_ca is not None:
            args += ["--tls-ca", swarm.tls_ca]
        return kfactory_argv(*args)

    return argv


def _detach(config: Path, url: str | None, home: Path) -> None:
    """Start the supervisor in a session of its own; return once it has started all."""
    log_path = swarm_dir(home) / "up.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    args = ["up", "--config", str(config), "--home", str(home)]
    if url is not None:
        args += ["--nats", url]
    with log_path.open("ab") as out:
        process = subprocess.Popen(
            kfactory_argv(*args),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    deadline = time.monotonic() + DETACH_WAIT
    while time.monotonic() < deadline:
        state = read_state(home)
        if state is not None and state.pid == process.pid and state.ready:
            typer.echo(
                f"kfactory up: {len(state.processes)} processes started in {home} "
                f"(supervisor pid {process.pid}, log {log_path}); `kfactory ps` lists the "
                "live actors, `kfactory down` stops them",
                err=True,
            )
            if state.url:
                typer.echo(state.url)
            return
        if process.poll() is not None:
            tail = " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-3:])
            raise UserError(f"the swarm exited with {process.returncode}: {tail}")
        time.sleep(0.1)
    raise UserError(f"the swarm did not start within {DETACH_WAIT:.0f} s; see {log_path}")


def down(home: Path | None = HOME) -> None:
    folder = resolve_home(home).absolute()
    state = read_state(folder)
    if state is None:
        typer.echo(f"kfactory down: no swarm in {folder}", err=True)
        return
    started = time.monotonic()
    killed = stop_swarm(folder)
    took = time.monotonic() - started
    if killed:
        typer.echo(f"kfactory down: had to kill {', '.join(killed)}", err=True)
        sys.exit(1)
    typer.echo(f"kfactory down: stopped {len(state.processes)} processes in {took:.1f} s", err=True)
