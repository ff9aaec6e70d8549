"""A MAP-Elites archive of kernels: the best kernel per niche, and parents drawn across niches.

A niche is (template family, algorithm, performance band); the band is floor(log2(speedup)),
clamped. Rejected kernels live in their own cells (band None), the parents of fix attempts.
The archive is pure logic: the same entries (in any order) and the same seed give the
same parents, so a planner can rebuild it from replayed history.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from typing import NamedTuple

import msgspec

LOWEST_BAND = -4
HIGHEST_BAND = 8


class ArchiveEntry(msgspec.Struct, frozen=True, kw_only=True):
    candidate_id: str
    source_hash: str
    family: str
    algorithm: str
    speedup: float | None
    """Over the baseline; None when the kernel was rejected."""
    source: str

    @property
    def verified(self) -> bool:
        return self.speedup is not None


class Niche(NamedTuple):
    family: str
    algorithm: str
    band: int | None
    """floor(log2(speedup)) clamped to [LOWEST_BAND, HIGHEST_BAND]; None for rejected."""


def band_of(speedup: float | None) -> int | None:
    return None if speedup is None else _band(speedup)


def _band(speedup: float) -> int:
    if not math.isfinite(speedup) or speedup <= 0:
        raise ValueError(f"a speedup must be a positive finite number, got {speedup}")
    return max(LOWEST_BAND, min(HIGHEST_BAND, math.floor(math.log2(speedup))))


def _order(niche: Niche) -> tuple[str, str, int]:
    return niche.family, niche.algorithm, LOWEST_BAND - 1 if niche.band is None else niche.band


def _better(new: ArchiveEntry, old: ArchiveEntry) -> bool:
    """Faster wins; among rejected kernels the newest (largest UUIDv7) wins; ties by id."""
    if new.speedup is not None and old.speedup is not None and new.speedup != old.speedup:
        return new.speedup > old.speedup
    if new.speedup is None:
        return new.candidate_id > old.candidate_id
    return new.candidate_id < old.candidate_id


class Archive:
    def __init__(self, entries: Iterable[ArchiveEntry] = ()) -> None:
        self._cells: dict[Niche, ArchiveEntry] = {}
        for entry in entries:
            self.add(entry)

    def __len__(self) -> int:
        return len(self._cells)

    @staticmethod
    def niche_of(entry: ArchiveEntry) -> Niche:
        return Niche(entry.family, entry.algorithm, band_of(entry.speedup))

    def add(self, entry: ArchiveEntry) -> bool:
        """Keep `entry` if its cell is empty or it beats the cell's elite; True if it was kept."""
        niche = self.niche_of(entry)
        incumbent = self._cells.get(niche)
        if incumbent is None or _better(entry, incumbent):
            self._cells[niche] = entry
            return True
        return False

    def cells(self) -> dict[Niche, ArchiveEntry]:
        return {n: self._cells[n] for n in sorted(self._cells, key=_order)}

    def elites(self) -> list[ArchiveEntry]:
        """The verified elites, in niche order."""
        return [e for e in self.cells().values() if e.verified]

    def rejected(self) -> list[ArchiveEntry]:
        return [e for e in self.cells().values() if not e.verified]

    def best(self) -> ArchiveEntry | None:
        elites = self.elites()
        if not elites:
            return None
        return min(elites, key=lambda e: (-_speedup(e), e.candidate_id))

    def select_parents(self, rng: random.Random, k: int) -> list[ArchiveEntry]:
        """k parents for improve, drawn across niches (each niche once before any repeats).

        A niche's weight grows with its band, so faster kernels are favoured, but every
        niche can be drawn: the search keeps its diversity instead of climbing one hill.
        """
        elites = self.elites()
        chosen: list[ArchiveEntry] = []
        while elites and len(chosen) < k:
            pool = list(elites)
            while pool and len(chosen) < k:
                pick = _weighted(rng, pool)
                chosen.append(pool.pop(pick))
        return chosen

    def select_pair(self, rng: random.Random) -> tuple[ArchiveEntry, ArchiveEntry] | None:
        """Two parents from different niches for crossover; None with fewer than two niches.

        The second parent takes another approach (family or algorithm) when one exists.
        """
        elites = self.elites()
        if len(elites) < 2:
            return None
        first = elites.pop(_weighted(rng, elites))
        other = [e for e in elites if (e.family, e.algorithm) != (first.family, first.algorithm)]
        pool = other or elites
        return first, pool[_weighted(rng, pool)]

    def select_to_fix(self, rng: random.Random) -> ArchiveEntry | None:
        """A rejected kernel to repair, one per (family, algorithm), chosen uniformly."""
        rejected = self.rejected()
        return rejected[rng.randrange(len(rejected))] if rejected else None


def _weighted(rng: random.Random, pool: list[ArchiveEntry]) -> int:
    """An index into `pool`, weighted 1 + (band - lowest band in the pool)."""
    bands = [_band(_speedup(e)) for e in pool]
    low = min(bands)
    weights = [1 + b - low for b in bands]
    return rng.choices(range(len(pool)), weights=weights)[0]


def _speedup(entry: ArchiveEntry) -> float:
    if entry.speedup is None:
        raise ValueError(f"{entry.candidate_id} was rejected; it has no speedup")
    return entry.speedup
