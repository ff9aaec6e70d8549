"""Device leases: one timed window at a time on a device, and the host's other work
between windows.

A device is a CPU host's cores (`cpu.<host>`) or one GPU (`cuda.<host>.<index>`). In the
KV bucket KF_DEVICE_LEASES (`bus/lease.py`: a TTL, renewed while held, fenced by the KV
revision) it has

- one *timing* lease, `<device>.timing`, held by the benchmarker timing on it: one
  benchmarker at a time, across processes and hosts;
- a *shared* lease per process whose work would disturb a timed window there
  (verification, compilation, float64 references): `<device>.shared.<holder>`.

It is a readers-writer lock in which timing goes first:
- a benchmarker takes the timing lease (new shared work now waits), then waits until no
  shared lease is left (the work already running finishes; one that died expires);
- shared work takes its own key, then reads the timing key; if a benchmarker holds it, it
  gives its key back and waits until the timed window is over.
Both write first and read second on one KV stream, whose writes are totally ordered, so
they can never both go ahead. Timing never starves: one verification at most runs on
after a benchmarker asked. Shared work can wait behind several timed windows in a row,
but benchmarkers only have work that verifiers passed, so it is bounded in practice.

A holder that dies stops renewing; its lease expires after `DEVICE_LEASE_TTL` (10 s) and
the device is free. The GPU index is the worker's first CUDA_VISIBLE_DEVICES entry. The
hub's admin creates the bucket; only the benchmarker, verifier and kernel-writer (the
agent operator's tool runs) users may use it (`ops/accounts.py`), and the latter two only
for shared leases (`SHARED_KEYS`): the server refuses their writes to a timing key, so
they cannot squat, renew or release one. The cuda
compiler (nvcc, on the host CPU) takes no share of a GPU.
What a holder waits for is `report`ed in words, which become its heartbeat's state:
`waiting for the lease on cpu.<host>, held by benchmarker-2`, `timing on cpu.<host>
(lease 42)`, `waiting for benchmarker-2's timed window on cpu.<host>`.

A timed window lasts one timing run's warm-up and timed rounds. The CPU driver sets a run
up first (kernel processes, arenas, fresh inputs) and says when it is ready and when its
timed rounds end (`gpu_workers/runner_files.py`); `TimingWindows` opens and closes the
window around them, and the judging and re-check after it run with a share. A repeated
run or a calibration waits for a window of its own; the CUDA driver holds its window for
the whole run. A window whose lease was lost yields no result: the message goes back and
its next delivery finds any outcome already in the history.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import re
import threading
from collections.abc import Awaitable, Callable

from nats.js import JetStreamContext

from bus.lease import (
    DEVICE_LEASES,
    AcquireStopped,
    HeldLease,
    LeaseBucket,
    LeaseError,
    LeaseLost,
    kv_stream,
)

#: The keys of shared leases (`<device>.shared.<holder>`, a device being `cpu.<host>` or
#: `cuda.<host>.<index>`): all a user that only shares devices may write (ops/accounts.py),
#: so it can neither take, renew nor release a timing lease.
SHARED_KEYS = ("*.*.shared.*", "*.*.*.shared.*")

#: Seconds a device lease lives without renewal: a dead holder frees the device this late.
DEVICE_LEASE_TTL = 10
#: How often a waiter looks again (a timed window lasts seconds).
POLL_SECONDS = 0.1
#: How often a worker thread waiting on the event loop checks that it still runs.
LOOP_CHECK_SECONDS = 0.25

Report = Callable[[str], None]


def _token(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)[:128] or "_"


def device_key(kind: str, host: str, index: str | None = None) -> str:
    """The lease key of a device: `cpu.<host>`, or `cuda.<host>.<index>` for one GPU."""
    parts = [_token(kind), _token(host)]
    if index is not None:
        parts.append(_token(index))
    return ".".join(parts)


def _ignore(_: str) -> None:
    pass


class DeviceLeases:
    """The device leases one process (`holder`, its instance name) takes."""

    def __init__(self, leases: LeaseBucket, holder: str) -> None:
        self.leases = leases
        self.holder = holder

    @classmethod
    async def open(
        cls, js: JetStreamContext, holder: str, ttl: int = DEVICE_LEASE_TTL
    ) -> DeviceLeases:
        """The device leases of the bucket the hub creates (waiting until it has)."""
        return cls(await LeaseBucket.open(js, DEVICE_LEASES, ttl, wait=True), holder)

    def timing(
        self, device: str, report: Report = _ignore, stop: asyncio.Event | None = None
    ) -> DeviceWindow:
        """Hold `device` exclusively for a timed window (`async with`): its timing lease,
        and no shared work left running on it. `report` says what it waits for, in words.
        Watch the held lease's `lost`, or call its `check()` before trusting what was
        timed."""
        return DeviceWindow(self, device, report, stop)

    def shared(
        self, device: str, report: Report = _ignore, stop: asyncio.Event | None = None
    ) -> DeviceShare:
        """Hold a share of `device` between its timed windows (`async with`: verification,
        compilation). Losing it does not spoil the work: a timed window that then
        overlaps it reports the contention."""
        return DeviceShare(self, device, report, stop)

    async def shared_holders(self, device: str) -> list[str]:
        """Who holds a share of `device` now."""
        prefix = f"$KV.{self.leases.bucket}.{device}.shared."
        info = await self.leases.js.stream_info(
            kv_stream(self.leases.bucket), subjects_filter=f"{prefix}*"
        )
        holders = []
        for subject in sorted((info.state.subjects or {}).keys()):
            lease = await self.leases.current(subject.removeprefix(f"$KV.{self.leases.bucket}."))
            if lease is not None and lease.holder != self.holder:
                holders.append(lease.holder)
        return holders

    async def timing_holder(self, device: str) -> str | None:
        """Who times on `device` now, if anyone."""
        lease = await self.leases.current(f"{device}.timing")
        return lease.holder if lease else None


class _DeviceLease:
    """A device lease held for an `async with` block: a plain object around the held
    lease, not an async generator, so that the task leaving it may differ from the task
    that entered it and nothing is left for the event loop to finalise (a timed window is
    opened and closed from a worker thread)."""

    def __init__(
        self, leases: DeviceLeases, device: str, report: Report, stop: asyncio.Event | None
    ) -> None:
        self.leases, self.device, self.report, self.stop = leases, device, report, stop
        self._held: HeldLease | None = None

    async def __aexit__(self, *_: object) -> None:
        held, self._held = self._held, None
        if held is not None:
            await held.__aexit__(None, None, None)


class DeviceWindow(_DeviceLease):
    """`DeviceLeases.timing`."""

    async def __aenter__(self) -> HeldLease:
        key, bucket = f"{self.device}.timing", self.leases.leases
        while True:
            held = bucket.held(key, self.leases.holder, wait=False)
            try:
                await held.__aenter__()
                break
            except LeaseError:
                other = await bucket.current(key)
                if other is not None:  # else just released: take it
                    self.report(f"waiting for the lease on {self.device}, held by {other.holder}")
                    await _pause(self.stop)
        try:
            while busy := await self.leases.shared_holders(self.device):
                self.report(f"waiting for {', '.join(busy)} to finish on {self.device}")
                held.check()
                await _pause(self.stop)
        except BaseException:
            await held.__aexit__(None, None, None)
            raise
        self.report(f"timing on {self.device} (lease {held.token})")
        self._held = held
        return held


class DeviceShare(_DeviceLease):
    """`DeviceLeases.shared`."""

    async def __aenter__(self) -> HeldLease:
        bucket, holder = self.leases.leases, self.leases.holder
        key = f"{self.device}.shared.{_token(holder)}"
        timing = f"{self.device}.timing"
        while True:
            held = bucket.held(key, holder, stop=self.stop)
            await held.__aenter__()
            try:
                window = await bucket.current(timing)
            except BaseException:
                await held.__aexit__(None, None, None)
                raise
            if window is None or window.holder == holder:
                self._held = held
                return held
            await held.__aexit__(None, None, None)
            self.report(f"waiting for {window.holder}'s timed window on {self.device}")
            while (await bucket.current(timing)) is not None:
                await _pause(self.stop)


class TimingWindows:
    """`device`'s timing lease as a worker thread opens and closes it around each timed
    window (`gpu_workers.protocols.TimingWindow`), taken and given back on the event
    loop `loop`, and the benchmarker's share of the device around everything else it
    does there. `share` takes the share (the build, then the driver's set-up); opening a
    window gives the share back first, so that a benchmarker waiting for a window holds
    none (two waiting on each other would deadlock), then takes the timing lease;
    closing it takes the share again before it gives the timing lease back (no other
    window can open in between), and keeps it until the next window or `release`: the
    run's judging and re-check go on beside verification, but no other benchmarker's
    window opens over them. `enter`/`exit` are open and close on the loop itself;
    `opened`, if given, runs on the loop each time a window is taken (it may raise to
    give the run up). A window whose lease was lost while open is remembered: `check`
    raises it, and its result must not count. `abandon` gives the job up (the worker is
    stopping): the thread's `watch`, `open` and `close` then raise or return at once, so
    its run is killed and no thread waits on a loop that stopped."""

    def __init__(
        self,
        leases: DeviceLeases,
        device: str,
        loop: asyncio.AbstractEventLoop,
        report: Report = _ignore,
        opened: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.leases, self.device, self.loop, self.report = leases, device, loop, report
        self.opened = opened
        self.tokens: list[int] = []
        """The fencing token of every window opened, in order."""
        self._open: tuple[contextlib.AsyncExitStack, HeldLease] | None = None
        self._share: contextlib.AsyncExitStack | None = None
        self._lost: LeaseLost | None = None
        self._abandoned = threading.Event()
        self._opening: concurrent.futures.Future[None] | None = None

    async def share(self) -> None:
        """Hold a share of the device (waiting out a timed window), if not holding one."""
        if self._share is None and self._open is None:
            share = contextlib.AsyncExitStack()
            await share.enter_async_context(self.leases.shared(self.device, self.report))
            self._share = share

    async def enter(self) -> None:
        if self._open is not None:
            return
        await self._drop_share()
        stack = contextlib.AsyncExitStack()
        held = await stack.enter_async_context(self.leases.timing(self.device, self.report))
        self._open = (stack, held)
        self.tokens.append(held.token)
        if self.opened is not None:
            await self.opened()

    async def exit(self) -> None:
        if self._open is None:
            return
        (stack, held), self._open = self._open, None
        try:
            held.check()
            share = contextlib.AsyncExitStack()  # held alone still: the share is granted at once
            await share.enter_async_context(self.leases.shared(self.device, self.report))
            self._share = share
        except LeaseLost as lost:
            self._lost = self._lost or lost
        finally:
            await stack.aclose()

    async def release(self) -> None:
        """Close the window if open, and give the device's share back."""
        await self.exit()
        await self._drop_share()

    async def _drop_share(self) -> None:
        share, self._share = self._share, None
        if share is not None:
            await share.aclose()

    def open(self) -> None:
        """From the worker thread: take the window (raises WindowsAbandoned once the job
        was given up, and at once if it is given up while this waits)."""
        self.watch()
        opening = asyncio.run_coroutine_threadsafe(self.enter(), self.loop)
        self._opening = opening
        try:
            self._wait_on_loop(opening)
        finally:
            self._opening = None

    def close(self) -> None:
        """From the worker thread: give the window back."""
        self._wait_on_loop(asyncio.run_coroutine_threadsafe(self.exit(), self.loop))

    def watch(self) -> None:
        """From the worker thread, while a run goes on: raises WindowsAbandoned once the
        job was given up (the back end then kills the run)."""
        if self._abandoned.is_set():
            raise WindowsAbandoned("the timing job was given up")

    def abandon(self) -> None:
        """On the loop: give the job up. The worker thread's next `watch`, `open` or
        `close` raises or returns at once, and a window it waits for is not taken;
        `release` still has to be awaited once the thread is done."""
        self._abandoned.set()
        opening = self._opening
        if opening is not None:
            opening.cancel()

    def _wait_on_loop(self, step: concurrent.futures.Future[None]) -> None:
        """Wait for a step on the loop, but never on a loop that stopped running (the
        process is ending): the thread would wait for ever, and the process with it."""
        while True:
            try:
                step.result(timeout=LOOP_CHECK_SECONDS)
                return
            except concurrent.futures.CancelledError:
                raise WindowsAbandoned("the timing job was given up") from None
            except concurrent.futures.TimeoutError:
                if not self.loop.is_running():
                    step.cancel()
                    raise WindowsAbandoned("the event loop stopped") from None

    def check(self) -> None:
        """Raise LeaseLost if any window's lease was lost while it was open."""
        if self._lost is not None:
            raise self._lost


class WindowsAbandoned(Exception):
    """The timing job was given up (its worker is stopping): no window opens for it."""


async def _pause(stop: asyncio.Event | None) -> None:
    if stop is None:
        await asyncio.sleep(POLL_SECONDS)
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(POLL_SECONDS):
            await stop.wait()
    if stop.is_set():
        raise AcquireStopped("stopped while waiting for a device")
