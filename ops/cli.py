"""`kfactory`: the one command line of Kernel Factory.

Each group of subcommands lives in its own `ops/*_cmd.py` module with a
`register(app)` function; this module only assembles them and turns failures
into one clear line (a traceback only with `--debug`).
"""

from __future__ import annotations

import importlib
import signal
import sys
import threading

import typer

from ops.errors import UserError

COMMAND_MODULES = (
    "ops.server_cmd",
    "ops.creds_cmd",
    "ops.deploy_cmd",
    "ops.up_cmd",
    "ops.sql_cmd",
    "ops.events_cmd",
    "ops.ps_cmd",
    "ops.actor_cmd",
    "ops.bench_cmd",
    "ops.run_cmd",
    "ops.problems_cmd",
    "ops.check_cmd",
    "ops.new_cmd",
    "ops.gpu_check_cmd",
    "ops.replay_cmd",
    "ops.lessons_cmd",
    "ops.audit_cmd",
    "ops.best_cmd",
    "ops.campaigns_cmd",
    "ops.export_cmd",
    "ops.report_cmd",
)

app = typer.Typer(
    name="kfactory",
    help=(
        "Kernel Factory: a swarm of actors on NATS that writes, verifies and benchmarks "
        "compute kernels, recording every fact as an event in DuckDB.\n\n"
        "Start with `kfactory run` (everything embedded on this machine), or "
        "`kfactory server` plus `kfactory actor ROLE --nats URL` on other hosts."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_debug = False


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks and debug logs."),
) -> None:
    global _debug
    _debug = debug
    from ops.logging import configure_logging

    configure_logging(debug=debug)


class BrokenCommandModule(ImportError):
    """A command module that cannot be imported: the command line refuses to start
    without it rather than drop its commands."""


def register_commands(target: typer.Typer, modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise BrokenCommandModule(
                f"the command module {name} cannot be imported: {type(exc).__name__}: {exc}",
                name=name,
            ) from exc
        module.register(target)


register_commands(app, COMMAND_MODULES)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `kfactory` console script (`argv` None: the process's own)."""
    if argv is None and threading.current_thread() is threading.main_thread():
        # A Ctrl-C outside a command's own stop (`ops.lifecycle`, which hands this back
        # when its body ends) ends the process at once and silently (the default action),
        # never as a KeyboardInterrupt raised wherever the interpreter is, as the command
        # ends or in the interpreter's shutdown, which would print a traceback.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        app(args=argv)  # standalone: usage errors and --help exit through SystemExit
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        print("kfactory: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # every failure becomes one line unless --debug
        if _debug:
            raise
        if isinstance(exc, UserError):
            print(f"kfactory: error: {exc}", file=sys.stderr)
            return 2
        print(f"kfactory: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
