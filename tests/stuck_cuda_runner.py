"""A stand-in for the CUDA runner (`gpu_workers.cuda.runner`), run only in the sandbox
child, for the call-deadline tests on a host without a GPU: a runner whose host thread
is stuck in a timed call, where its own deadline check cannot run. It stamps the call on
the call clock and never returns. A job with `judged_calls=0` stands for a runner stuck
between calls instead: its call ended (the clock cleared), and only the sandbox's wall
clock stops it."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from gpu_workers import runner_files as files
from gpu_workers.cuda import protocol as p
from gpu_workers.cuda.call_clock import CallClock


def main(args: list[str]) -> None:
    job = msgspec.json.decode(Path(files.REQUEST_FILE).read_bytes(), type=p.BenchJob)
    Path(files.PROGRESS_FILE).write_text("timing")
    clock = CallClock()
    clock.started()
    if job.judged_calls == 0:
        clock.ended()
    time.sleep(3600)
