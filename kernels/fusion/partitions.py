"""Fusion partitions of a chain: contiguous groups of ops, each group one kernel.

A chain of n ops has 2^(n-1) partitions (a cut or not between each neighbouring pair).
A partition is plain data, a tuple of groups of op names, with a stable key:
groups joined by "|", ops inside a group by "+" ("add+rmsnorm|gelu").
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

GROUP_SEP = "|"
OP_SEP = "+"


@dataclass(frozen=True)
class Partition:
    groups: tuple[tuple[str, ...], ...]

    @property
    def key(self) -> str:
        return GROUP_SEP.join(OP_SEP.join(group) for group in self.groups)

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(op for group in self.groups for op in group)

    def as_lists(self) -> list[list[str]]:
        """The groups as the `FusionPlanned.groups` field wants them."""
        return [list(group) for group in self.groups]

    def __str__(self) -> str:
        return self.key


def partitions(ops: Sequence[str]) -> list[Partition]:
    """Every partition of the chain, from fully unfused (one op per group) to fully fused,
    ordered by number of groups (most first), then by the sizes of the groups left to right."""
    ops = tuple(ops)
    if not ops:
        return []
    found: list[Partition] = []
    for cuts in itertools.product((True, False), repeat=len(ops) - 1):
        groups: list[tuple[str, ...]] = []
        start = 0
        for index, cut in enumerate(cuts, start=1):
            if cut:
                groups.append(ops[start:index])
                start = index
        groups.append(ops[start:])
        found.append(Partition(tuple(groups)))
    return sorted(found, key=lambda p: (-len(p.groups), [len(g) for g in p.groups]))


def parse_partition(
    value: str | Partition | Sequence[Sequence[str]], ops: Sequence[str]
) -> Partition:
    """A partition from its key, its groups, or itself; it must cover `ops` in order."""
    if isinstance(value, Partition):
        partition = value
    elif isinstance(value, str):
        partition = Partition(tuple(tuple(group.split(OP_SEP)) for group in value.split(GROUP_SEP)))
    else:
        partition = Partition(tuple(tuple(group) for group in value))
    if partition.ops != tuple(ops) or any(not group for group in partition.groups):
        raise ValueError(
            f"partition {partition.key!r} does not split the chain {OP_SEP.join(ops)} "
            "into contiguous, non-empty groups"
        )
    return partition
