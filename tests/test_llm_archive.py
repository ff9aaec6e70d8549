"""The MAP-Elites archive: one elite per niche, parents drawn across niches."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from actors.search.llm.archive import Archive, ArchiveEntry, Niche, band_of


def entry(cid: str, family: str, algorithm: str, speedup: float | None) -> ArchiveEntry:
    return ArchiveEntry(
        candidate_id=cid,
        source_hash=f"sha-{cid}",
        family=family,
        algorithm=algorithm,
        speedup=speedup,
        source=f"/* {cid} */",
    )


ENTRIES = [
    entry("c01", "softmax", "threepass", 1.5),
    entry("c02", "softmax", "threepass", 1.9),  # same niche as c01 (band 0), better
    entry("c03", "softmax", "threepass", 5.0),  # band 2
    entry("c04", "softmax", "online", 3.0),  # band 1
    entry("c05", "softmax", "online", 12.0),  # band 3: the global best
    entry("c06", "llm", "twopass", 0.4),  # band -2
    entry("c07", "llm", "twopass", None),  # rejected
    entry("c08", "llm", "twopass", None),  # rejected, newer
]


def test_bands_follow_log2_of_the_speedup() -> None:
    assert [band_of(s) for s in (0.4, 0.99, 1.0, 1.9, 2.0, 12.0, 1e9)] == [-2, -1, 0, 0, 1, 3, 8]
    assert band_of(None) is None
    with pytest.raises(ValueError):
        band_of(0.0)
    with pytest.raises(ValueError):
        band_of(float("nan"))


def test_each_niche_keeps_its_best_and_order_does_not_matter() -> None:
    archive = Archive(ENTRIES)
    assert len(archive) == 6
    cells = archive.cells()
    assert cells[Niche("softmax", "threepass", 0)].candidate_id == "c02"
    assert cells[Niche("llm", "twopass", None)].candidate_id == "c08"
    best = archive.best()
    assert best is not None and best.candidate_id == "c05"
    shuffled = list(ENTRIES)
    random.Random(3).shuffle(shuffled)
    assert Archive(shuffled).cells() == cells
    assert not archive.add(entry("c09", "softmax", "threepass", 1.2))
    assert archive.add(entry("c10", "softmax", "threepass", 1.95))


def test_parents_come_from_several_niches_not_only_the_best() -> None:
    archive = Archive(ENTRIES)
    parents = archive.select_parents(random.Random(7), 4)
    assert len(parents) == 4
    assert len({archive.niche_of(p) for p in parents}) == 4  # no niche twice before all used
    assert all(p.verified for p in parents)

    counts: Counter[str] = Counter()
    for seed in range(300):
        counts.update(p.candidate_id for p in archive.select_parents(random.Random(seed), 1))
    assert set(counts) == {"c02", "c03", "c04", "c05", "c06"}  # every elite gets a turn
    assert counts["c05"] > counts["c06"]  # faster niches are favoured
    assert counts["c05"] < 300 * 0.6  # but the best does not take everything


def test_more_parents_than_niches_repeat_niches_evenly() -> None:
    archive = Archive(ENTRIES)
    parents = archive.select_parents(random.Random(1), 12)
    counts = Counter(p.candidate_id for p in parents)
    assert set(counts) == {"c02", "c03", "c04", "c05", "c06"}
    assert sorted(counts.values()) == [2, 2, 2, 3, 3]  # rounds of 5, 5, then 2
    assert {p.candidate_id for p in parents[:5]} == set(counts)
    assert {p.candidate_id for p in parents[5:10]} == set(counts)


def test_selection_is_deterministic_given_the_seed() -> None:
    archive = Archive(ENTRIES)
    one = [p.candidate_id for p in archive.select_parents(random.Random(42), 5)]
    two = [p.candidate_id for p in Archive(reversed(ENTRIES)).select_parents(random.Random(42), 5)]
    assert one == two


def test_crossover_pairs_come_from_different_approaches() -> None:
    archive = Archive(ENTRIES)
    for seed in range(50):
        pair = archive.select_pair(random.Random(seed))
        assert pair is not None
        a, b = pair
        assert archive.niche_of(a) != archive.niche_of(b)
        assert (a.family, a.algorithm) != (b.family, b.algorithm)


def test_crossover_within_one_approach_uses_two_bands() -> None:
    archive = Archive(ENTRIES[:3])  # softmax/threepass in bands 0 and 2
    pair = archive.select_pair(random.Random(0))
    assert pair is not None
    assert {p.candidate_id for p in pair} == {"c02", "c03"}


def test_too_few_niches_give_no_pair_and_rejected_kernels_are_there_to_fix() -> None:
    archive = Archive([entry("c01", "softmax", "threepass", 1.5), entry("c07", "x", "y", None)])
    assert archive.select_pair(random.Random(0)) is None
    assert archive.select_parents(random.Random(0), 3) == [ENTRIES[0]] * 3
    to_fix = archive.select_to_fix(random.Random(0))
    assert to_fix is not None and to_fix.candidate_id == "c07"
    assert Archive().select_parents(random.Random(0), 2) == []
    assert Archive().select_to_fix(random.Random(0)) is None
