"""bench/softmax_hand.c, the hand-written AVX2 reference the softmax figures lean on, is
a kernel the verifier takes at every shape it draws (1x1 and row lengths that are no
multiple of the vector loops' step included), in each structure."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.verification import verify
from kernels.builtin import BUILTIN
from tests.cpu_support import cpu_backend, kf_cache

__all__ = ["cpu_backend", "kf_cache"]

HAND = Path(__file__).parent.parent / "bench" / "softmax_hand.c"
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp")
AVX2 = " avx2 " in f" {Path('/proc/cpuinfo').read_text().replace(chr(10), ' ')} "


@pytest.mark.skipif(not AVX2, reason="the hand-written kernel is AVX2 code; this CPU has none")
@pytest.mark.parametrize(("structure", "exp"), [(0, 5), (1, 4), (2, 0), (3, 4), (0, 6), (1, 6)])
def test_each_hand_written_structure_verifies(
    structure: int, exp: int, cpu_backend: CpuBackend
) -> None:
    source = f"#define STRUCTURE {structure}\n#define EXP {exp}\n" + HAND.read_text()
    verdict = verify(BUILTIN["softmax"], cpu_backend, source, FLAGS, seed=7)
    assert verdict.verified, verdict.rejection
