"""CPU time of this process's threads other than the calling one, each read on its own clock.

While the driver waits for a kernel's call, what its other threads run (a thread pool still
spinning after its work, an OpenMP team of its own) takes cores from the kernel: the timing
run counts it as contention. It is read thread by thread, on each thread's CPU clock, and
not as the process's CPU time less the caller's: under a CPU-time limit (RLIMIT_CPU, which
the sandbox sets) Linux reads the process's time from a counter that lags its running
thread by up to a scheduler tick, so a caller that computed for milliseconds before a call
(the driver timing the baseline) showed that work as another thread's, during the call.
On a 2-core host that read 0.22 to 0.43 cores of phantom contention in every timing run at
softmax 512x2048 on an idle host, and nearly every run was repeated twice more.
"""

from __future__ import annotations

import os
import threading
import time

Snapshot = dict[int, int]
"""CPU nanoseconds by thread id, of the threads but the caller."""

TASKS = "/proc/self/task"
_CPUCLOCK_THREAD_SCHED = 6
"""Linux's clock id bits for a thread's CPU clock: per thread (4), scheduler time (2)."""


def _clock_of(tid: int) -> int:
    """The CPU clock id of thread `tid` of this process (the kernel's MAKE_THREAD_CPUCLOCK)."""
    return (~tid << 3) | _CPUCLOCK_THREAD_SCHED


def snapshot() -> Snapshot:
    """Each other thread's CPU time now; empty where /proc is not mounted."""
    me = threading.get_native_id()
    try:
        tids = [int(name) for name in os.listdir(TASKS)]
    except OSError:
        return {}
    found: Snapshot = {}
    for tid in tids:
        if tid == me:
            continue
        try:
            found[tid] = time.clock_gettime_ns(_clock_of(tid))
        except OSError:
            continue  # the thread ended after the listing
    return found


def used_since(before: Snapshot) -> int:
    """CPU nanoseconds the other threads used since `before`: a thread started since counts
    whole; one that ended since is not counted (its last part is lost, never invented)."""
    return sum(ns - before.get(tid, 0) for tid, ns in snapshot().items())
