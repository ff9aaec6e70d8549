"""Running a command's event loop so that SIGINT and SIGTERM end it within 2 s.

The command's body gets a `stop` event, set by the first signal, and winds down on its
own. If it is still running `STOP_GRACE` (1.2 s) later it is cancelled, whatever it was
doing (connecting, starting the hub, waiting for a reply); `UNWIND_GRACE` (0.6 s) after
that the process exits anyway, saying so. Work handed to threads (a compile, a
benchmark) cannot be cancelled: a stopped command does not wait for those threads (their
work was left for redelivery), which is where `asyncio.run` kept an embedded `kfactory
run` for minutes after SIGTERM. A stopped command exits with `STOPPED` (130); a server,
whose normal end is a signal, with 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from bus.connection import ConnectStopped

T = TypeVar("T")

#: After a signal, the body has this long to finish before it is cancelled.
STOP_GRACE = 1.2
#: And this long more to unwind from the cancellation, before the process just exits.
UNWIND_GRACE = 0.6
#: The exit status of a command stopped by a signal.
STOPPED = 130


class Stopped(Exception):
    """The command was stopped by SIGINT or SIGTERM before it finished."""


def run_until_stopped(
    body: Callable[[asyncio.Event], Coroutine[Any, Any, T]],
    stopped: str = "stopped",
    exit_status: int = STOPPED,
) -> T:
    """Run `body(stop)`; raises Stopped if a signal cut it short (its result is lost),
    saying `stopped` on stderr first (the process may end before the caller can). A
    signal after the body ended gets the handler the process had before (`kfactory`'s:
    the default action), never the body's stop: the command's outcome is decided."""
    loop = asyncio.new_event_loop()
    signalled = False
    try:
        asyncio.set_event_loop(loop)
        stop = asyncio.Event()
        signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)
        if threading.current_thread() is not threading.main_thread():
            signals = ()  # only the main thread receives signals (a test runs us in another)
        before = {sig: signal.getsignal(sig) for sig in signals}
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
        main = loop.create_task(body(stop))
        try:
            result, signalled = loop.run_until_complete(_bounded(main, stop, exit_status))
        except (asyncio.CancelledError, ConnectStopped):
            signalled = True
            print(f"kfactory: {stopped}", file=sys.stderr, flush=True)
            raise Stopped() from None
        finally:
            _hand_back(loop, before)
            _cancel_the_rest(loop)
        return result
    finally:
        _close(loop, stopped=signalled, exit_status=exit_status)


def _hand_back(loop: asyncio.AbstractEventLoop, before: dict[signal.Signals, Any]) -> None:
    """Give each signal back the handler it had before the loop took it. Blocked while
    that happens, so one that comes meanwhile waits for that handler, and is neither the
    loop's (a stop the body will never see) nor Python's KeyboardInterrupt in between."""
    if not before:
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, set(before))
    try:
        for sig, handler in before.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(before))


async def _bounded(main: asyncio.Task[T], stop: asyncio.Event, exit_status: int) -> tuple[T, bool]:
    """The body's result, and whether a signal came before it ended (one that comes
    after is not the body's: its outcome stands)."""
    signalled: list[bool] = []  # as the body ended
    main.add_done_callback(lambda _: signalled.append(stop.is_set()))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({main, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not main.done():
            await asyncio.wait({main}, timeout=STOP_GRACE)
        if not main.done():
            main.cancel()
            await asyncio.wait({main}, timeout=UNWIND_GRACE)
        if not main.done():
            print("kfactory: did not stop within 2 s of the signal; exiting", file=sys.stderr)
            _exit_now(exit_status)
        return main.result(), signalled[0] if signalled else stop.is_set()
    finally:
        stopping.cancel()


def _cancel_the_rest(loop: asyncio.AbstractEventLoop) -> None:
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.wait(pending, timeout=UNWIND_GRACE))
    for task in pending:
        if not task.done():
            # Left behind on purpose (e.g. waiting for a thread that cannot be cancelled;
            # its work was left for redelivery): its end, whenever the collector finds
            # it, is not news. `run_until_complete` lets its own task go the same way.
            task._log_destroy_pending = False  # type: ignore[attr-defined]


def _close(loop: asyncio.AbstractEventLoop, stopped: bool, exit_status: int) -> None:
    with contextlib.suppress(Exception):
        loop.run_until_complete(loop.shutdown_asyncgens())
    executor = getattr(loop, "_default_executor", None)
    if executor is not None:
        executor.shutdown(wait=not stopped, cancel_futures=True)
    asyncio.set_event_loop(None)
    loop.close()
    if stopped and _busy_threads():
        # A compile or benchmark still running in a worker thread: the interpreter would
        # wait for it at exit. Its work was left for redelivery; nothing is lost.
        _exit_now(exit_status)


def _busy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]


def _exit_now(status: int) -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)


def run_command(
    body: Callable[[asyncio.Event], Coroutine[Any, Any, T]],
    stopped: str = "stopped",
    stopped_status: int = STOPPED,
) -> T:
    """`run_until_stopped` for a command: a stop cut short ends the process with
    `stopped_status` (130; 0 for a server, whose normal end is a signal)."""
    import typer

    try:
        return run_until_stopped(body, stopped, stopped_status)
    except Stopped:
        raise typer.Exit(stopped_status) from None
