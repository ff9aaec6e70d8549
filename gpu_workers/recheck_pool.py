"""A campaign's secret pool of re-check inputs, with their float64 references.

After timing, a kernel is re-checked on every distribution at the timed shape. At a
campaign's shape (16 M elements for softmax 4096x4096) drawing those inputs and computing
their float64 references costs more than the timing itself, and is the same work for
every candidate. The pool keeps, for each distribution, `SETS` (2) input sets drawn from
seeds no one is told, as .npy files in one private folder the worker creates (mode 0700)
and removes (a killed worker's is removed by the next pool made on the host); a set is
filled the first time a re-check draws it, so a campaign computes them a few times, not
once per candidate. For fp32 a set keeps, instead of its float64 reference, each output's
pass band (`gpu_workers.pass_band`): outputs inside it pass on float32 comparisons, and
only for an output outside it is the reference made again (other dtypes keep the
reference and error scale). Each re-check draws, per distribution, one set from its own
secret seed.

Why this keeps the rule: a kernel cannot predict which inputs it gets. Its process sees
an empty read-only root and may open nothing (seccomp), so it can neither read the pool
nor leave anything for a later kernel; every kernel's outputs are judged on the whole
set; and it never learns which set it was given. The set's seed is reported with the
re-check, so a failure can be replayed exactly.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import numpy as np

from gpu_workers.held_folder import HeldFolder
from gpu_workers.pass_band import Band, pass_band
from kernels.spec import Arrays, Problem

SETS = 2
"""Input sets per distribution; each re-check draws one of them at random."""
SEED_FILE = "seed"


class PoolEntry:
    """One input set of one distribution: inputs, references and scales, memory-mapped."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @property
    def ready(self) -> bool:
        return (self.folder / SEED_FILE).is_file()

    @property
    def seed(self) -> int:
        return int((self.folder / SEED_FILE).read_text())

    def _load(self, kind: str, names: list[str]) -> Arrays:
        return {n: np.load(self.folder / f"{kind}-{n}.npy", mmap_mode="r") for n in names}

    def inputs(self, problem: Problem) -> Arrays:
        return self._load("in", [a.name for a in problem.inputs])

    def expected(self, problem: Problem) -> Arrays | None:
        """The float64 reference, where the set keeps one (not with bands: the judge
        computes it from the inputs for an output outside its band)."""
        return self._kept("expected", problem)

    def scales(self, problem: Problem) -> Arrays | None:
        return self._kept("scale", problem)

    def _kept(self, kind: str, problem: Problem) -> Arrays | None:
        names = [a.name for a in problem.outputs]
        if not all((self.folder / f"{kind}-{n}.npy").is_file() for n in names):
            return None
        return self._load(kind, names)

    def bands(self, problem: Problem) -> dict[str, Band] | None:
        """Each output's pass band (`gpu_workers.pass_band`), where the set has them (fp32)."""
        names = [a.name for a in problem.outputs]
        if not all((self.folder / f"band-lo-{n}.npy").is_file() for n in names):
            return None
        return {
            n: Band(
                lo=np.load(self.folder / f"band-lo-{n}.npy", mmap_mode="r"),
                hi=np.load(self.folder / f"band-hi-{n}.npy", mmap_mode="r"),
                nan_at=np.load(self.folder / f"band-nan-{n}.npy"),
            )
            for n in names
        }

    def fill(self, problem: Problem, shape: dict[str, int], distribution: str, dtype: str) -> None:
        """Draw the set from a fresh secret seed, with each output's pass band (fp32; other
        dtypes: the float64 reference and scale), in a folder of its own renamed into
        place when complete (a reader never sees half a set; of two drivers filling the
        same set, the first to finish wins)."""
        seed = secrets.randbits(63)
        inputs = problem.generate(shape, distribution, seed, dtype)
        expected = problem.expected(inputs)
        scales = problem.scales(inputs, expected)
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{self.folder.name}-", dir=self.folder.parent))
        kept = [("in", inputs)]
        if dtype == "fp32":  # the bands judge; the reference is made again only on a miss
            for name in expected:
                band = pass_band(expected[name], scales[name], problem.tolerances[dtype])
                np.save(partial / f"band-lo-{name}.npy", band.lo)
                np.save(partial / f"band-hi-{name}.npy", band.hi)
                np.save(partial / f"band-nan-{name}.npy", band.nan_at)
        else:
            kept += [("expected", expected), ("scale", scales)]
        for kind, arrays in kept:
            for name, array in arrays.items():
                np.save(partial / f"{kind}-{name}.npy", np.asarray(array))
        (partial / SEED_FILE).write_text(str(seed))
        try:
            os.rename(partial, self.folder)
        except OSError:  # filled meanwhile by another driver: keep theirs
            shutil.rmtree(partial, ignore_errors=True)


def entry(
    folder: Path, problem: Problem, shape: dict[str, int], dtype: str, distribution: str, draw: int
) -> PoolEntry:
    """The set `draw` picks (modulo SETS) for one distribution of a problem, at one shape
    and dtype."""
    spec = hashlib.sha256(problem.load_spec.encode()).hexdigest()[:16]
    dims = "x".join(f"{k}{v}" for k, v in sorted(shape.items()))
    return PoolEntry(folder / spec / f"{dims}-{dtype}" / distribution / str(draw % SETS))


class RecheckPool:
    """The pool's folder, private to this worker and removed with it; if the worker is
    killed, by the next pool made on this host (`gpu_workers.held_folder`)."""

    def __init__(self) -> None:
        self._held = HeldFolder("kf-recheck-pool-")
        self.folder = self._held.path

    def close(self) -> None:
        self._held.release()
