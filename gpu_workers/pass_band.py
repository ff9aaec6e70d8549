"""A stored reference's pass band: every float32 output that passes, as an interval per
element, so a kernel's outputs are judged by two float32 comparisons per element.

`quick_compare.all_pass` decides, per element, in float64: a finite output g passes a
finite reference e when |fl64(g - e)| <= atol + rtol * scale. For a fixed e, fl64(g - e)
is monotone in g (rounding is monotone), so when two float32 values lo <= hi both pass,
every g with lo <= g <= hi passes too: |fl64(g - e)| <= max(|fl64(lo - e)|, |fl64(hi - e)|).
The band's ends are taken one float32 inside e -/+ allowed and then CHECKED with that same
float64 rule; an end that does not pass, or an element whose reference is not finite,
gets the empty band (NaN ends, which nothing is between). So the band only ever accepts
what `all_pass` accepts: it is sound by construction, whatever the rounding did on the
way.

Exceptions to the interval, kept as lists: a reference that is an infinity passes only
that infinity (lo = hi = it); a NaN reference passes any NaN but the poison (`nan_at`).
Anything outside the band falls back to the whole-array rules, which decide and name the
failure (a finite reference whose float32 rounding overflows, passed by the right
infinity, also goes that way: it is rare and the rules there decide it).

Worth it where one reference judges many outputs: the secret re-check pool keeps each
set's band beside its float64 reference, and every later kernel is judged in float32 at
memory speed instead of in float64 chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kernels.spec import Array, Tolerance

F32 = np.float32
CHUNK = 1 << 16
"""Elements per step: the float64 temporaries stay in cache."""


@dataclass(frozen=True)
class Band:
    lo: npt.NDArray[np.float32]
    hi: npt.NDArray[np.float32]
    nan_at: npt.NDArray[np.int64]
    """Flat indices whose reference is NaN: any NaN but the poison passes there."""


def passes(g: Array, e: Array, allowed: Array) -> Array:
    """`all_pass`'s rule for a finite reference, element-wise (g float32, e and allowed
    float64)."""
    g64 = g.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.isfinite(g64) & (np.abs(g64 - e) <= allowed)


def pass_band(expected: Array, scale: Array, tolerance: Tolerance) -> Band:
    """The band of float32 outputs that pass against `expected` (float64) with `scale`:
    each end one float32 inside e -/+ allowed, checked with the float64 rule (an end that
    fails gives the empty band). At most one float32 of the exact band is lost at each end;
    an output there goes to the float64 rules, which pass it."""
    e_all = np.asarray(expected, dtype=np.float64).reshape(-1)
    s_all = np.asarray(scale, dtype=np.float64).reshape(-1)
    lo_all = np.empty(e_all.size, F32)
    hi_all = np.empty(e_all.size, F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, e_all.size, CHUNK):
            e = e_all[start : start + CHUNK]
            s = s_all[start : start + CHUNK]
            finite = np.isfinite(e)
            s = np.where(np.isfinite(s), s, np.where(finite, np.abs(e), 0.0))
            allowed = tolerance.atol + tolerance.rtol * s
            # beyond float32's range the cast gives an infinity: one step in is its limit
            lo = np.nextafter((e - allowed).astype(F32), F32(np.inf))
            hi = np.nextafter((e + allowed).astype(F32), F32(-np.inf))
            unsound = ~(finite & (lo <= hi) & np.isfinite(lo) & np.isfinite(hi))
            unsound |= ~_within_allowed(lo, e, allowed) | ~_within_allowed(hi, e, allowed)
            lo[unsound] = np.nan
            hi[unsound] = np.nan
            infinite = np.isinf(e)
            lo[infinite] = e[infinite]
            hi[infinite] = e[infinite]
            lo_all[start : start + CHUNK] = lo
            hi_all[start : start + CHUNK] = hi
    return Band(lo=lo_all, hi=hi_all, nan_at=np.flatnonzero(np.isnan(e_all)))


def _within_allowed(end: Array, e: Array, allowed: Array) -> Array:
    """|fl64(end - e)| <= allowed, in place on one temporary."""
    diff = end.astype(np.float64)
    np.subtract(diff, e, out=diff)
    np.abs(diff, out=diff)
    return diff <= allowed


def within(got: Array, band: Band, poison_bits: int) -> bool:
    """True when every element of `got` (float32) is in its band: then `all_pass` passes
    it too. False says nothing: the whole-array rules decide."""
    g = np.asarray(got).reshape(-1)
    if g.dtype != F32 or g.size != band.lo.size:
        return False
    inside = (g >= band.lo) & (g <= band.hi)
    outside = np.flatnonzero(~inside)
    if outside.size != band.nan_at.size or not np.array_equal(outside, band.nan_at):
        return False
    at = g[outside]
    return bool(np.all(np.isnan(at) & (at.view(np.uint32) != np.uint32(poison_bits))))
