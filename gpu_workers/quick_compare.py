"""The common case of a comparison, fast: every element passes.

`gpu_workers.verification.compare_outputs` judges whole arrays, making a dozen float64
temporaries the size of the output; at a timed shape (16 M elements) that is seconds of
memory traffic and page faults. This pass applies the same rules chunk by chunk, in
temporaries that stay in cache, and only says whether every element passes and which
element has the largest relative error. Where anything fails, the caller runs the
whole-array comparison, which finds the same failure and writes its evidence.

`every_element_passes` is the verdict alone, for judges that need no worst element: most
chunks are plainly right (a finite reference and scale, the output within atol + rtol *
scale), which five array operations show; only a chunk that is not goes through
`all_pass`'s rules, which decide it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernels.spec import Array, Tolerance

CHUNK = 1 << 16


@dataclass(frozen=True)
class Worst:
    """`rel` the largest relative error; the rest the element closest to failing: the one
    whose error used the largest share of its tolerance (`used`, 1.0 = at the limit)."""

    rel: float
    flat_index: int
    got: float
    expected: float
    scale: float
    used: float = 0.0


def all_pass(
    got: Array, expected: Array, scale: Array, poison_bits: int, tolerance: Tolerance
) -> Worst | None:
    """The worst element when every element of `got` passes against `expected`; None as
    soon as one does not (unwritten, a lost NaN or infinity, a non-finite value where the
    reference is finite and does not overflow the type, or an error beyond tolerance)."""
    g_all = got.reshape(-1)
    e_all = np.asarray(expected, dtype=np.float64).reshape(-1)
    s_all = np.asarray(scale, dtype=np.float64).reshape(-1)
    uint = np.dtype(f"uint{8 * got.dtype.itemsize}")
    floor = tolerance.atol / tolerance.rtol
    worst = Worst(rel=0.0, flat_index=0, got=0.0, expected=0.0, scale=0.0)
    rel_max = 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, g_all.size, CHUNK):
            g = g_all[start : start + CHUNK]
            if np.any(g.view(uint) == poison_bits):
                return None
            e = e_all[start : start + CHUNK]
            g64 = g.astype(np.float64)
            exact_nan, exact_inf = np.isnan(e), np.isinf(e)
            if np.any(exact_nan & ~np.isnan(g64)) or np.any(exact_inf & (g64 != e)):
                return None
            finite = ~(exact_nan | exact_inf)
            rounded = e.astype(got.dtype).astype(np.float64)
            right_infinity = np.isinf(rounded) & finite & (g64 == np.copysign(np.inf, e))
            if np.any(finite & ~np.isfinite(g64) & ~right_infinity):
                return None
            judged = finite & ~right_infinity
            err = np.where(judged, np.abs(g64 - e), 0.0)
            s = s_all[start : start + CHUNK]
            s = np.where(np.isfinite(s), s, np.where(finite, np.abs(e), 0.0))
            allowed = tolerance.atol + tolerance.rtol * s
            if np.any(err > allowed):
                return None
            if err.size:
                rel_max = max(rel_max, float(np.max(err / np.maximum(s, floor))))
                used = np.divide(err, allowed, out=np.zeros_like(err), where=allowed > 0)
                w = int(np.argmax(used))
                if float(used[w]) >= worst.used:
                    worst = Worst(
                        rel=0.0,
                        flat_index=start + w,
                        got=float(g64[w]),
                        expected=float(e[w]),
                        scale=float(s[w]),
                        used=float(used[w]),
                    )
    return Worst(
        rel=rel_max,
        flat_index=worst.flat_index,
        got=worst.got,
        expected=worst.expected,
        scale=worst.scale,
        used=worst.used,
    )


def every_element_passes(
    got: Array, expected: Array, scale: Array, poison_bits: int, tolerance: Tolerance
) -> bool:
    """`all_pass(...) is not None`, without the worst element: each chunk plainly within
    tolerance passes; any other chunk is decided by `all_pass`."""
    g_all = got.reshape(-1)
    e_all = np.asarray(expected, dtype=np.float64).reshape(-1)
    s_all = np.asarray(scale, dtype=np.float64).reshape(-1)
    for start in range(0, g_all.size, CHUNK):
        g, e, s = (a[start : start + CHUNK] for a in (g_all, e_all, s_all))
        if (
            not _plainly_within(g, e, s, tolerance)
            and all_pass(g, e, s, poison_bits, tolerance) is None
        ):
            return False
    return True


def _plainly_within(g: Array, e: Array, s: Array, tolerance: Tolerance) -> bool:
    """Every element finite, within a finite allowance of a finite reference: what
    `all_pass` accepts first of all (a NaN anywhere, the poison included, makes it False)."""
    allowed = s * tolerance.rtol
    allowed += tolerance.atol
    error = g.astype(np.float64)
    error -= e
    np.abs(error, out=error)
    with np.errstate(invalid="ignore"):
        return bool(np.all(error <= allowed)) and bool(np.all(allowed < np.inf))
