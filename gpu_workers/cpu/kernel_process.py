"""The driver's handle on one kernel host: the process that holds an untrusted kernel.

The host (kernel_host.c) shares only the arena with the driver. Each call is stamped here,
around a command and its reply over pipes; between calls the host is stopped (SIGSTOP), so
nothing of the kernel runs while the driver checks outputs, writes fresh inputs or times
the baseline. An ending of the host is the kernel's doing and is raised as KernelEnded.

- `nop` is a round trip that calls nothing: the handshake's cost, recorded with a timing.
- The kernel shares the host's reply pipe, so it could answer "done" early: it is then
  stopped where it is and its half-written outputs are judged. If the host's own answer
  is still waiting on the pipe once the host is stopped, the kernel wrote one of its own:
  `forged_reply`.
- Other endings: `timeout` (no answer within the run's wall-clock limit, or its CPU time
  used up), `memory_limit` (an allocation refused under the address-space limit),
  `crashed`, `exited`, `load_failed`, `forbidden_syscall` (named), `input_written` (a
  write to an input, whose pages are read-only in the host: named), `fp_state` (the
  floating-point control state changed) and `unstoppable` (a thread that SIGSTOP did not
  stop within STOP_SECONDS, such as one waiting uninterruptibly: the kernel's doing).
- `mechanisms` records each containment the host applied, or why not; `kfactory check`
  prints them. `HOST_ENV` and the root folder's name are the same in every run: nothing
  tells a kernel whether it is verified or timed.
- `helper_cpu_ns`: CPU time the driver's other threads used while a call was timed, which
  took those cores from the kernel (`other_threads`); the timing run counts it as
  contention.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import secrets
import select
import signal
import struct
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from gpu_workers.cpu import other_threads
from gpu_workers.cpu import protocol as p
from gpu_workers.cpu.arena import Arena, Slot, guard_ranges, read_only_ranges
from gpu_workers.results import Mechanism, Rejection, Stage
from gpu_workers.sandbox_outcome import ALLOCATION_REFUSED_MARK

MAX_ARRAYS, MAX_DIMS, MAX_GUARDS = 16, 8, 64
OP_CALL, OP_GUARD, OP_NOP, OP_EXIT, OP_UNGUARD, OP_READ_ONLY = 1, 2, 3, 4, 5, 6
ST_OK, ST_FORBIDDEN_SYSCALL, ST_FP_STATE, ST_BAD_COMMAND, ST_INPUT_WRITTEN = 0, 1, 2, 3, 4
EXIT_LOAD_FAILED, EXIT_FORBIDDEN, EXIT_SETUP_FAILED = 90, 91, 92
MAGIC = 0x6B66686F
NOT_NEEDED = -1
"""A mechanism the host did not need (a user namespace, when started as root)."""
MECHANISMS = (
    ("user_namespace", "a user namespace (needed only when not started as root)"),
    ("pid_namespace", "its own PID namespace: every process in it dies with the kernel"),
    ("network_namespace", "its own empty network namespace"),
    ("mount_namespace", "its own mount namespace"),
    ("ipc_namespace", "its own IPC namespace"),
    ("unprivileged_user", "runs as an unprivileged user of its own"),
    ("empty_read_only_root", "an empty, read-only root directory (chroot)"),
    ("rlimits", "no core files, 1 MiB of file writes, address-space and CPU-time limits"),
    ("process_limit", "RLIMIT_NPROC: one OpenMP team of threads and no more"),
    ("no_new_privs", "no new privileges (PR_SET_NO_NEW_PRIVS)"),
    (
        "seccomp",
        "seccomp: memory, threads and waiting only; no files, processes, sockets, clocks, "
        "affinity, fixed mappings or changes to the arena's protections",
    ),
    ("no_timestamp_counter", "rdtsc and rdtscp fault (PR_SET_TSC): no clock of its own"),
)
COMMAND = struct.Struct(f"<II{MAX_ARRAYS}Q{MAX_DIMS}q{MAX_GUARDS}Q{MAX_GUARDS}Q")
REPLY = struct.Struct("<IIq")
HELLO = struct.Struct(f"<I{len(MECHANISMS)}i")
PID = struct.Struct("<q")
STOP_SECONDS = 10.0
"""How long every thread may take to show it has stopped: on a host loaded several times
over (a shared 2-core CI machine), a thread can wait over a second for a core first."""
HOST_ENV = {"OMP_PROC_BIND": "false", "GOMP_SPINCOUNT": "10000"}
"""The kernel's whole environment, the same whenever a kernel runs: nothing in it says
whether a call is verified or timed. OpenMP binds no threads (the filter refuses
sched_setaffinity: a kernel chooses no cores of its own); the host binds the team itself
before the filter, one thread per usable CPU (`kernel_host.c`)."""


class KernelEnded(Exception):
    """The kernel host ended or misbehaved: the kernel's fault, with the evidence."""

    def __init__(self, reason: str, message: str, evidence: dict[str, str]) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.evidence = evidence


class HostLimits:
    """The kernel process's address space and CPU time, and the wall-clock time its calls
    may take in all, from its start."""

    def __init__(
        self,
        address_space_bytes: int,
        cpu_seconds: int,
        wall_seconds: float,
        call_seconds: float | None = None,
    ) -> None:
        self.address_space_bytes = address_space_bytes
        self.cpu_seconds = cpu_seconds
        self.wall_seconds = wall_seconds
        self.call_seconds = call_seconds
        """Each call's own deadline (None: only the run's)."""


@functools.cache
def syscall_names() -> dict[int, str]:
    """x86-64 system call numbers to names, from the kernel headers when present."""
    names: dict[int, str] = {}
    for header in (
        Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
        Path("/usr/include/asm/unistd_64.h"),
    ):
        with contextlib.suppress(OSError):
            for m in re.finditer(r"#define __NR_(\w+) (\d+)", header.read_text()):
                names[int(m.group(2))] = m.group(1)
            break
    return names


def syscall_name(number: int) -> str:
    return syscall_names().get(number, f"#{number}")


class KernelProcess:
    """Starts the host on `library` with `arena`; `call` runs the kernel once and returns
    the nanoseconds between sending the command and reading the reply."""

    def __init__(
        self,
        host: str,
        library: str,
        n_arrays: int,
        n_dims: int,
        arena: Arena,
        limits: HostLimits,
        root: Path,
        log: Path,
    ) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.wall_seconds
        self._call_deadline: float | None = None
        self.log = log
        self.calls = 0
        self.helper_cpu_ns = 0
        """CPU time the driver's other threads used while this kernel's calls were timed."""
        self._read_only_names: list[str] = []
        root.mkdir(mode=0o755, exist_ok=True)
        command_r, self._command = os.pipe()
        self._reply, reply_w = os.pipe()
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        argv = [
            host,
            library,
            str(n_arrays),
            str(n_dims),
            str(limits.address_space_bytes),
            str(limits.cpu_seconds),
            str(root),
        ]
        try:
            self.spawned = os.posix_spawn(
                host,
                argv,
                HOST_ENV,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, command_r, 0),
                    (os.POSIX_SPAWN_DUP2, reply_w, 1),
                    (os.POSIX_SPAWN_DUP2, log_fd, 2),
                    (os.POSIX_SPAWN_DUP2, arena.fd, 3),
                ],
                setsid=True,
            )
        finally:
            for fd in (command_r, reply_w, log_fd):
                os.close(fd)
        self.pid = self.spawned
        self.exit_status: int | None = None
        self._guard_key = secrets.randbits(62) | 1
        """Sent with every guard command: the host's filter lets only an mprotect in the
        arena that carries it through, and the kernel never sees it."""
        try:
            (self.pid,) = PID.unpack(self._read(PID.size, "starting"))
            hello = HELLO.unpack(self._read(HELLO.size, "loading the kernel"))
        except KernelEnded:
            self.kill()
            raise
        if hello[0] != MAGIC:
            self.kill()
            raise KernelEnded(
                "crashed",
                "the kernel's process answered garbage while loading",
                {"log": self.log_tail()},
            )
        self.mechanisms = [
            Mechanism(name=name, applied=code == 0, note=_note(what, code))
            for (name, what), code in zip(MECHANISMS, hello[1:], strict=True)
            if code != NOT_NEEDED
        ]
        self._stop()

    # --- calls ------------------------------------------------------------------------

    def call(self, offsets: Sequence[int], dims: Sequence[int], what: str) -> int:
        """Run the kernel once on arrays at `offsets`; its nanoseconds, stamped from here."""
        command = COMMAND.pack(
            OP_CALL,
            0,
            *_padded(offsets, MAX_ARRAYS),
            *_padded(dims, MAX_DIMS),
            *([0] * (2 * MAX_GUARDS)),
        )
        status, mxcsr, x87, ns = self._roundtrip(command, what)
        self.calls += 1
        if status == ST_FP_STATE:
            self.kill()
            raise KernelEnded(
                "fp_state",
                f"the kernel changed the floating-point control state (MXCSR {mxcsr:#06x}, "
                f"x87 control word {x87:#06x}) during {what}",
                {
                    "mxcsr": f"{mxcsr:#06x}",
                    "expected_mxcsr": "0x1f80",
                    "x87_control": f"{x87:#06x}",
                    "expected_x87_control": "0x037f",
                    "progress": what,
                },
            )
        return ns

    def nop(self) -> int:
        """One round trip that calls nothing: what the handshake itself costs."""
        command = COMMAND.pack(OP_NOP, 0, *([0] * (MAX_ARRAYS + MAX_DIMS + 2 * MAX_GUARDS)))
        return self._roundtrip(command, "a handshake")[3]

    def guard(
        self, ranges: Sequence[tuple[int, int]], read_only: Sequence[tuple[str, int, int]]
    ) -> None:
        """Make exactly these (offset, length) ranges of the arena inaccessible to the kernel,
        and the (name, offset, length) ranges of its inputs read-only: a write there ends
        the run as `input_written`, naming the input."""
        if len(read_only) > MAX_GUARDS:
            raise ValueError(f"more than {MAX_GUARDS} read-only ranges")
        self._command_ok(OP_UNGUARD, [], [])
        for first in range(0, len(ranges), MAX_GUARDS):
            chunk = ranges[first : first + MAX_GUARDS]
            self._command_ok(OP_GUARD, [o for o, _ in chunk], [n for _, n in chunk])
        self._command_ok(OP_READ_ONLY, [o for _, o, _ in read_only], [n for *_, n in read_only])
        self._read_only_names = [name for name, *_ in read_only]

    def protect(self, slots: Sequence[Slot], names: Sequence[str], outputs: Sequence[bool]) -> None:
        """`guard` for these buffers: their guard pages inaccessible, the inputs' read-only."""
        self.guard(guard_ranges(slots), read_only_ranges(names, outputs, slots))

    def _command_ok(self, op: int, offsets: list[int], lengths: list[int]) -> None:
        command = COMMAND.pack(
            op,
            len(offsets),
            *([0] * MAX_ARRAYS),
            self._guard_key,
            *([0] * (MAX_DIMS - 1)),
            *_padded(offsets, MAX_GUARDS),
            *_padded(lengths, MAX_GUARDS),
        )
        if self._roundtrip(command, "setting guard pages")[0] != ST_OK:
            raise RuntimeError("the kernel host refused the guard pages")

    def cpu_seconds(self) -> float:
        """CPU time the kernel's process has used (all its threads), from /proc."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _roundtrip(self, command: bytes, what: str) -> tuple[int, int, int, int]:
        self._continue()
        helpers = other_threads.snapshot()
        started = time.perf_counter_ns()
        self._start_call_clock()
        try:
            os.write(self._command, command)
        except BrokenPipeError:
            self._ended(what)
        try:
            reply = self._read(REPLY.size, what)
        finally:
            self._call_deadline = None
        elapsed = time.perf_counter_ns() - started
        self.helper_cpu_ns += other_threads.used_since(helpers)
        status, mxcsr, detail = REPLY.unpack(reply)
        if status == ST_FORBIDDEN_SYSCALL:
            self._forbidden(detail, what)
        if status == ST_INPUT_WRITTEN:
            self._input_written(detail, what)
        self._stop()
        self._no_second_answer(what)
        return status, mxcsr, detail, elapsed

    def _no_second_answer(self, what: str) -> None:
        """The host answers each command once. More bytes waiting once it is stopped mean
        the kernel wrote an answer of its own on the reply pipe (a forged "done" to stop
        the clock early), whichever of the two arrived first."""
        if not select.select([self._reply], [], [], 0)[0]:
            return
        extra = os.read(self._reply, REPLY.size)
        if not extra:
            return  # the host ended: the next read reports how
        self.kill()
        raise KernelEnded(
            "forged_reply",
            f"the kernel wrote on the harness's reply pipe during {what}: a second answer "
            "was waiting after the call's own",
            {"progress": what, "extra_bytes": extra.hex(), "log": self.log_tail()},
        )

    def _start_call_clock(self) -> None:
        if self.limits.call_seconds is not None:
            self._call_deadline = time.monotonic() + self.limits.call_seconds

    def _read(self, size: int, what: str) -> bytes:
        data = b""
        while len(data) < size:
            if self._call_deadline is not None and self._call_deadline < self.deadline:
                self._wait_for_the_call(what)
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self._reply], [], [], left)[0]:
                self.kill()
                limit = self.limits.wall_seconds
                raise KernelEnded(
                    "timeout",
                    f"no answer within the run's {limit:g} s wall-clock limit during {what}",
                    {"progress": what, "limit_seconds": f"{limit:g}", "log": self.log_tail()},
                )
            chunk = os.read(self._reply, size - len(data))
            if not chunk:
                self._ended(what)
            data += chunk
        return data

    def _wait_for_the_call(self, what: str) -> None:
        """Wait for the call's answer until the call's own deadline; past it, the kernel
        is killed and the call is a timeout."""
        assert self._call_deadline is not None and self.limits.call_seconds is not None
        left = self._call_deadline - time.monotonic()
        if left > 0 and select.select([self._reply], [], [], left)[0]:
            return
        self.kill()
        limit = self.limits.call_seconds
        raise KernelEnded(
            "timeout",
            f"{what} took longer than its {limit:.3g} s deadline (derived from the kernel's "
            "verification pace and the problem's cost)",
            {"progress": what, "call_limit_seconds": f"{limit:.3g}", "log": self.log_tail()},
        )

    # --- endings --------------------------------------------------------------------

    def _forbidden(self, number: int, what: str) -> None:
        self.kill()
        name = syscall_name(number)
        raise KernelEnded(
            "forbidden_syscall",
            f"the kernel made the system call {name}, which a kernel may not make, during {what}",
            {"syscall": name, "number": str(number), "progress": what, "log": self.log_tail()},
        )

    def _input_written(self, index: int, what: str) -> None:
        self.kill()
        names = self._read_only_names
        name = names[index] if 0 <= index < len(names) else f"read-only range {index}"
        raise KernelEnded(
            "input_written",
            f"the kernel wrote to its input {name} during {what}: inputs are read-only",
            {"buffer": name, "progress": what, "log": self.log_tail()},
        )

    def _ended(self, what: str) -> None:
        status = self._wait(5.0)
        log = self.log_tail()
        evidence = {"progress": what, "log": log}
        if status is None:
            self.kill()
            raise KernelEnded(
                "crashed", f"the kernel's process stopped answering during {what}", evidence
            )
        if os.WIFSIGNALED(status):
            sig = signal.Signals(os.WTERMSIG(status)).name
            evidence["signal"] = sig
            if ALLOCATION_REFUSED_MARK in log:
                refused = log.split(ALLOCATION_REFUSED_MARK, 1)[1].splitlines()[0].strip()
                raise KernelEnded(
                    "memory_limit",
                    f"allocation refused ({self.limits.address_space_bytes >> 20} MiB of "
                    f"address space): {refused}, then killed by {sig} during {what}",
                    evidence,
                )
            if sig == "SIGXCPU":
                raise KernelEnded(
                    "timeout",
                    f"used up its {self.limits.cpu_seconds} s CPU-time limit during {what}",
                    evidence,
                )
            raise KernelEnded("crashed", f"killed by {sig} during {what}", evidence)
        code = os.WEXITSTATUS(status)
        evidence["exit_status"] = str(code)
        if code == EXIT_LOAD_FAILED:
            raise KernelEnded("load_failed", f"the kernel did not load: {log.strip()}", evidence)
        raise KernelEnded(
            "exited",
            f"the kernel's process exited with status {code} during {what} "
            "(the kernel ended the process)",
            evidence,
        )

    def log_tail(self, limit: int = 4000) -> str:
        try:
            data = self.log.read_bytes()[-limit:]
        except OSError:
            return ""
        return data.decode("utf-8", errors="replace")

    # --- process control --------------------------------------------------------------

    def _continue(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)

    def _stop(self) -> None:
        """Stop every thread of the kernel's process, and wait until each one has stopped."""
        try:
            os.kill(self.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + STOP_SECONDS
        tasks = Path(f"/proc/{self.pid}/task")
        states: list[str] = []
        while time.monotonic() < deadline:
            try:
                states = [_state(t / "stat") for t in tasks.iterdir()]
            except OSError:
                return  # gone: an ending the next read reports
            if all(state in "TtZX" for state in states):
                return
            time.sleep(0)
        self.kill()
        raise KernelEnded(
            "unstoppable",
            f"a thread of the kernel's process did not stop within {STOP_SECONDS:g} s "
            f"(thread states {''.join(states)}): the driver cannot freeze it between calls",
            {"states": "".join(states), "limit_seconds": f"{STOP_SECONDS:g}"},
        )

    def _wait(self, timeout: float) -> int | None:
        if self.exit_status is not None:
            return self.exit_status
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.spawned, os.WNOHANG)
            if pid == self.spawned:
                self.exit_status = status
                return status
            if time.monotonic() > deadline:
                return None
            time.sleep(0.005)

    def kill(self) -> None:
        for pid in {self.pid, self.spawned}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._wait(10.0)

    def close(self) -> None:
        """Ask the host to exit; kill it if it does not."""
        if self.exit_status is None:
            with contextlib.suppress(OSError):
                self._continue()
                os.write(
                    self._command,
                    COMMAND.pack(OP_EXIT, 0, *([0] * (MAX_ARRAYS + MAX_DIMS + 2 * MAX_GUARDS))),
                )
            if self._wait(2.0) is None:
                self.kill()
        for fd in (self._command, self._reply):
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> KernelProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _state(stat: Path) -> str:
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"  # the thread has gone


def _padded(values: Sequence[int], size: int) -> list[int]:
    if len(values) > size:
        raise ValueError(f"{len(values)} values; the host takes {size}")
    return [int(v) for v in values] + [0] * (size - len(values))


def _note(what: str, code: int) -> str:
    if code == 0:
        return what
    return f"refused by this host ({errno.errorcode.get(code, code)}: {os.strerror(code)}): {what}"


ROOT_DIR = "root"
"""The kernel's empty root, inside the driver's folder: the same name in every run."""


@contextlib.contextmanager
def kernel_process(
    job: p.KernelHostJob, library: str, n_arrays: int, n_dims: int, arena: Arena
) -> Iterator[KernelProcess]:
    """A kernel host for `library` over `arena`, started in the driver's folder."""
    limits = HostLimits(
        job.address_space_bytes, job.cpu_seconds, job.wall_seconds, job.call_seconds
    )
    with tempfile.TemporaryDirectory(prefix="log-", dir=".") as logs:
        process = KernelProcess(
            job.host,
            library,
            n_arrays,
            n_dims,
            arena,
            limits,
            root=Path(ROOT_DIR).resolve(),
            log=Path(logs) / "kernel.log",
        )
        try:
            yield process
        finally:
            process.close()


def ended_rejection(stage: Stage, ended: KernelEnded) -> Rejection:
    return Rejection(
        stage=stage, reason=ended.reason, message=ended.message, evidence=ended.evidence
    )
