"""A problem's family: the problems an operator's record carries over to.

A family is the target, the dtype and the names of the dimensions the problem's kernels
were timed at (`BenchmarkCompleted.shape`), sorted: `cols x rows fp32 cpu` holds every
row-wise problem on the CPU in fp32, `n fp32 cpu` the element-wise ones. What decides
whether an edit pays is the loop nest it edits (a row loop to parallelise, an inner loop
to vectorise, a reduction to unroll) and the instruction set and vector width it runs
with: the dimensions name the loop nest, the target and dtype the rest. The problem's
name, its shapes' extents and its maths are left out, so that a user's new row-wise
operation belongs to the family the earlier ones searched. The family is read from the
history alone (the first timed kernel of the problem that recorded its shape), so every
role and the audit agree on it; a problem none of whose kernels was timed has none yet.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Family:
    target: str
    dtype: str
    dims: tuple[str, ...]

    def words(self) -> str:
        return f"{' x '.join(self.dims)} {self.dtype} {self.target}"
