"""What a sandboxed runner's ending says about the kernel it ran, on every device.

`sandbox_failure` turns a child that did not finish (killed by a limit or a signal,
exited early) into a rejection with its evidence; the CUDA back end reads only a
wall-clock kill as the kernel's (gpu_workers.cuda.backend). The CPU driver never runs a
kernel itself: its kernel host's endings are read in gpu_workers.cpu.kernel_process.
`contention` is how busy the rest of the host was during a run.
"""

from __future__ import annotations

from pathlib import Path

from gpu_workers.results import Rejection
from gpu_workers.runner_files import RESULT_FILE, read_progress
from gpu_workers.sandbox import SandboxOutcome

ALLOCATION_REFUSED_MARK = "kf: allocation refused:"
"""The line a runner writes on stderr when an allocation is refused (the CPU kernels'
allocator wrappers do), so a run that then dies is a memory_limit, not a crash."""


def contention(outcome: SandboxOutcome) -> float | None:
    """Cores' worth of CPU time other processes used during the run, if known."""
    if outcome.other_cpu_seconds is None or outcome.wall_seconds <= 0:
        return None
    return outcome.other_cpu_seconds / outcome.wall_seconds


def sandbox_failure(outcome: SandboxOutcome, workdir: Path, stage: str) -> Rejection | None:
    """Turn a child that did not finish into a rejection with evidence; None if it finished
    (exited 0 and left RESULT_FILE)."""
    if outcome.ok and (workdir / RESULT_FILE).is_file():
        return None
    progress = read_progress(workdir)
    limit = outcome.report.address_space_limit_bytes
    address_space = f"{limit >> 20} MiB" if limit >= 0 else "not limited"
    evidence = {
        "progress": progress,
        "exit_status": str(outcome.returncode),
        "signal": outcome.signal_name or "",
        "wall_seconds": f"{outcome.wall_seconds:.2f}",
        "cpu_seconds": f"{outcome.cpu_seconds:.2f}",
        "stderr": outcome.stderr[-4000:],
        "stdout": outcome.stdout[-2000:],
        "limits": (
            f"wall {outcome.report.wall_seconds_limit:g} s, cpu "
            f"{outcome.report.cpu_seconds_limit} s, address space {address_space}"
        ),
    }
    refused = next(
        (ln for ln in outcome.stderr.splitlines() if ln.startswith(ALLOCATION_REFUSED_MARK)), None
    )
    if outcome.timed_out:
        reason = "timeout"
        message = f"no result within the {outcome.report.wall_seconds_limit:g} s wall-clock limit"
    elif outcome.cpu_limit_hit:
        reason = "timeout"
        message = f"used up its {outcome.report.cpu_seconds_limit} s CPU-time limit (RLIMIT_CPU)"
    elif refused is not None or "MemoryError" in outcome.stderr:
        reason = "memory_limit"
        what = refused[len(ALLOCATION_REFUSED_MARK) :].strip() if refused else "MemoryError"
        message = f"allocation refused (address space {address_space}): {what}"
        if outcome.signal_name:
            message += f", then killed by {outcome.signal_name}"
    elif outcome.signal_name:
        reason = "crashed"
        message = f"killed by {outcome.signal_name}"
    else:
        reason = "exited"
        message = (
            f"the process exited with status {outcome.returncode} before finishing "
            "(the kernel ended the process)"
        )
    return Rejection(
        stage=stage,  # type: ignore[arg-type]
        reason=reason,
        message=f"{message} during {progress}",
        evidence=evidence,
    )
