"""A best kernel's file names the flags it was built with when it was verified and timed."""

from __future__ import annotations

from pathlib import Path

from actors.records.best_kernels import kernel_text
from eventstore.events import CandidateProposed, GenerationOpened
from gpu_workers.cpu.backend import CpuBackend
from kernels.builtin import BUILTIN
from kernels.templates import example_kernel
from tests.cpu_support import cpu_backend, kf_cache
from tests.evolve_history import Log

__all__ = ["cpu_backend", "kf_cache"]


def test_the_flags_line_is_what_the_back_end_built_the_kernel_with(
    tmp_path: Path, cpu_backend: CpuBackend
) -> None:
    """The CPU back end builds -ffast-math kernels with -fno-finite-math-only added (NaN
    and infinity handling is judged). A file naming only the kernel's own flags handed
    users another build: on an AVX2 build of a pipelined softmax, 1.8x slower than the one
    timed, and free to drop the NaN handling that was verified."""
    example = example_kernel("softmax")
    assert example is not None
    flags = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
    log = Log(tmp_path)
    cid = f"{log.name}:g0:c0"
    log.add(GenerationOpened, generation=0, planned=1)
    log.add(CandidateProposed, template="seed", params={}, param_key="", **log.work(cid, 0))
    log.written(cid, 0, example.source, flags)
    log.timed(cid, 0, median_ns=40_000.0)

    text = kernel_text(log.history.candidates[cid])

    built = cpu_backend.compile(BUILTIN["softmax"], example.source, tuple(flags)).build
    assert built is not None
    assert built.flags != tuple(flags)  # the back end added to the kernel's own
    assert text.splitlines()[0] == f"// kfactory-flags: {' '.join(built.flags)}"
