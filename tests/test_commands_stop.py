"""Every command stops on SIGINT or SIGTERM, in every state: here while it connects to a
hub that is not there (the figures in the note come from a script, not from here)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

UNREACHABLE = "nats://127.0.0.1:1"
COMMANDS = {
    "actor": ["actor", "verifier", "--nats", UNREACHABLE],
    "run": ["run", "--problem", "softmax", "--nats", UNREACHABLE],
    "sql": ["sql", "SELECT 1", "--nats", UNREACHABLE],
    "events tail": ["events", "tail", "--nats", UNREACHABLE],
    "events show": ["events", "show", "--nats", UNREACHABLE],
    "ps": ["ps", "--nats", UNREACHABLE],
    "server --nats": ["server", "--nats", UNREACHABLE],
}
#: Generous: on a loaded 2-core host the interpreter alone takes seconds to exit.
EXITS_WITHIN = 15.0


def _handles_sigterm(pid: int) -> bool:
    """Whether the process installed its SIGTERM handler: its event loop is running."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize(
    "sig",
    [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
    ids=["SIGINT", "SIGTERM"],
)
def test_every_command_stops_while_connecting(tmp_path: Path, sig: signal.Signals) -> None:
    # All at once, so the whole matrix costs one interpreter start on this machine.
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-m", "ops.cli", *args, "--home", str(tmp_path / name)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in COMMANDS.items()
    }
    try:
        deadline = time.monotonic() + 120
        for name, process in processes.items():
            while not _handles_sigterm(process.pid):
                assert process.poll() is None, f"{name} ended early: {process.communicate()}"
                assert time.monotonic() < deadline, f"{name} never got to its event loop"
                time.sleep(0.05)
        time.sleep(0.5)  # into the connection attempts
        for process in processes.values():
            process.send_signal(sig)
        signalled = time.monotonic()
        for name, process in processes.items():
            left = max(EXITS_WITHIN - (time.monotonic() - signalled), 0.1)
            _, err = process.communicate(timeout=left)
            assert process.returncode in (0, 130), f"{name}: {process.returncode} {err}"
            assert "Traceback" not in err, f"{name}: {err}"
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def test_interactive_commands_give_up_on_an_unreachable_hub_in_one_line(tmp_path: Path) -> None:
    processes = {
        name: subprocess.Popen(
            [sys.executable, "-m", "ops.cli", *COMMANDS[name], "--home", str(tmp_path / name)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("sql", "events tail", "run")
    }
    for name, process in processes.items():
        _, err = process.communicate(timeout=120)
        assert process.returncode == 2, f"{name}: {err}"
        (line,) = err.strip().splitlines()
        assert line.startswith(
            f"kfactory: error: no NATS server reachable at {UNREACHABLE} after 10 s"
        ), f"{name}: {err}"


#: A handler that, cancelled, waits for its thread (as the benchmarker's timing does); the
#: stop's grace ends before the thread does, the loop closes, and the thread ends later.
#: `_exit_now` is made to return so that the process lives on to see the thread end.
ABANDONS_A_HANDLER = """
import asyncio, gc, sys, time
import ops.lifecycle as lifecycle

lifecycle._exit_now = lambda status: None

async def handler():
    running = asyncio.get_running_loop().run_in_executor(None, time.sleep, 2.5)
    try:
        await asyncio.shield(running)
    except asyncio.CancelledError:
        await asyncio.wait({running})
        raise

async def body(stop):
    asyncio.create_task(handler())
    await asyncio.sleep(0)
    stop.set()
    await asyncio.sleep(60)

try:
    lifecycle.run_until_stopped(body)
except lifecycle.Stopped:
    pass
time.sleep(3.5)
gc.collect()
print("exited", file=sys.stderr)
"""


def test_a_handler_left_behind_by_a_stop_is_let_go_without_a_word() -> None:
    """A task still unwinding when the grace ends is abandoned on purpose (its work was
    left for redelivery): its end, whenever it comes, says nothing on stderr."""
    done = subprocess.run(
        [sys.executable, "-c", ABANDONS_A_HANDLER], capture_output=True, text=True, timeout=60
    )
    said = done.stderr.splitlines()
    assert said == ["kfactory: stopped", "exited"], done.stderr


#: A body that ends with a thread still busy, and a Ctrl-C that reaches its loop as it
#: ends: queued by the body's last step, so the loop sees it once the body is done.
A_SIGNAL_AS_THE_BODY_ENDS = """
import asyncio, os, signal, sys, time
import ops.lifecycle as lifecycle

signal.signal(signal.SIGINT, signal.SIG_DFL)  # as `kfactory` runs its commands

async def body(stop):
    loop = asyncio.get_running_loop()
    loop.run_in_executor(None, time.sleep, 1.0)  # a compile or a timing, still running
    loop.call_soon(os.kill, os.getpid(), signal.SIGINT)
    return 0

print("returned", lifecycle.run_until_stopped(body), file=sys.stderr)
"""


def test_a_signal_that_comes_as_the_body_ends_leaves_its_outcome_alone() -> None:
    """The command's outcome was decided: it returns it (after its threads end), instead
    of exiting as stopped without a word."""
    done = subprocess.run(
        [sys.executable, "-c", A_SIGNAL_AS_THE_BODY_ENDS], capture_output=True, timeout=60
    )
    assert (done.returncode, done.stderr.decode().splitlines()) == (0, ["returned 0"])


#: A Ctrl-C after the body ended, once the loop has handed its signals back.
A_SIGNAL_AFTER_THE_BODY = """
import os, signal, sys
import ops.lifecycle as lifecycle

signal.signal(signal.SIGINT, signal.SIG_DFL)  # as `kfactory` runs its commands
cancel_the_rest = lifecycle._cancel_the_rest

def interrupted_meanwhile(loop):
    os.kill(os.getpid(), signal.SIGINT)
    cancel_the_rest(loop)

lifecycle._cancel_the_rest = interrupted_meanwhile

async def body(stop):
    return 0

print("returned", lifecycle.run_until_stopped(body), file=sys.stderr)
"""


def test_a_signal_after_the_body_gets_the_handler_the_process_had() -> None:
    """`kfactory`'s: the default action, at once and silently; not a KeyboardInterrupt
    raised wherever the interpreter is (a traceback), nor a stop nobody sees."""
    done = subprocess.run(
        [sys.executable, "-c", A_SIGNAL_AFTER_THE_BODY], capture_output=True, timeout=60
    )
    assert (done.returncode, done.stderr) == (-signal.SIGINT, b"")
