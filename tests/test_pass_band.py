"""The pass band accepts only what the float64 rules accept, and at its ends exactly so."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_workers.pass_band import Band, pass_band, within
from gpu_workers.quick_compare import all_pass
from kernels.builtin import BUILTIN
from kernels.spec import Tolerance

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # overflow on purpose
POISON = 0x7FBADBAD
TOLERANCES = [BUILTIN["softmax"].tolerances["fp32"], Tolerance(rtol=1e-6, atol=0.0)]


def _reference(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """References of every kind: ordinary, tiny, huge, near float32's limit, zero, NaN,
    infinities; scales ordinary, zero and non-finite."""
    e = rng.standard_normal(n) * 10.0 ** rng.integers(-40, 39, n)
    e[::97] = 0.0
    e[1::101] = np.nan
    e[2::103] = np.inf
    e[3::107] = -np.inf
    e[4::109] = 3.4028234e38 * (1 + rng.random(e[4::109].size) * 1e-7)  # rounds to inf
    s = np.abs(e) * rng.random(n) * 2
    s[5::113] = np.inf
    s[6::127] = 0.0
    return e, s


@pytest.mark.parametrize("tolerance", TOLERANCES)
def test_every_band_end_passes_and_two_float32_out_fail(tolerance: Tolerance) -> None:
    e, s = _reference(np.random.default_rng(0), 20_000)
    band = pass_band(e, s, tolerance)
    has = ~np.isnan(band.lo)
    assert has[np.isfinite(e)].mean() > 0.9  # almost every finite reference has a band
    for end, out in ((band.lo, -np.inf), (band.hi, np.inf)):
        for i in np.flatnonzero(has & np.isfinite(e))[:800]:
            # the end passes the float64 rules; two float32 further out do not (the band
            # is the exact one, less at most one float32 at each end)
            assert all_pass(end[i : i + 1], e[i : i + 1], s[i : i + 1], POISON, tolerance)
            beyond = np.nextafter(np.nextafter(end[i : i + 1], np.float32(out)), np.float32(out))
            if np.isfinite(beyond[0]):
                assert all_pass(beyond, e[i : i + 1], s[i : i + 1], POISON, tolerance) is None


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("tolerance", TOLERANCES)
def test_the_band_never_accepts_what_the_float64_rules_reject(
    seed: int, tolerance: Tolerance
) -> None:
    """Outputs at, just inside and just beyond the band ends, NaN, poison and infinities:
    whenever the band says pass, `all_pass` (what the judge accepted before) passes too,
    element by element; and an output the rules reject never passes the band."""
    rng = np.random.default_rng(seed)
    e, s = _reference(rng, 3_000)
    band = pass_band(e, s, tolerance)
    right = np.where(np.isnan(band.lo), e.astype(np.float32), band.lo)
    choices = [
        band.lo,
        band.hi,
        np.nextafter(band.lo, np.float32(-np.inf)),
        np.nextafter(band.hi, np.float32(np.inf)),
        e.astype(np.float32),
        np.full(e.size, np.nan, np.float32),
        np.full(e.size, np.inf, np.float32),
        np.full(e.size, -np.inf, np.float32),
        np.full(e.size, np.float32(0.0)),
    ]
    pick = rng.integers(0, len(choices), e.size)
    got = np.choose(pick, choices).astype(np.float32)
    got.view(np.uint32)[rng.integers(0, e.size, 5)] = POISON
    verdicts = 0
    for i in range(e.size):
        one = got[i : i + 1]
        in_band = within(one, _slice(band, i), POISON)
        rules = all_pass(one, e[i : i + 1], s[i : i + 1], POISON, tolerance) is not None
        assert not in_band or rules, (i, e[i], s[i], one[0], band.lo[i], band.hi[i])
        verdicts += in_band
    assert verdicts > e.size // 10  # the band accepted many: the test exercised it
    # whole arrays of a softmax-like output: the reference rounded to float32 passes the
    # band; one element one float32 beyond its band, a lost NaN or the poison do not
    e = rng.random(50_000)
    e[::1000] = np.nan
    e[1::1000] = np.inf
    band = pass_band(e, np.abs(e), tolerance)
    right = e.astype(np.float32)
    assert within(right, band, POISON)
    assert all_pass(right, e, np.abs(e), POISON, tolerance) is not None
    for i in (7, 12_345, 49_999):
        for end, out in ((band.hi[i], np.inf), (band.lo[i], -np.inf)):
            wrong = right.copy()
            wrong[i] = np.nextafter(end, np.float32(out))
            assert not within(wrong, band, POISON)  # the float64 rules decide
            wrong[i] = np.nextafter(wrong[i], np.float32(out))
            assert not within(wrong, band, POISON)
            assert all_pass(wrong, e, np.abs(e), POISON, tolerance) is None
    lost = right.copy()
    lost[int(band.nan_at[0])] = 0.0  # a NaN reference answered with a number
    assert not within(lost, band, POISON)
    unwritten = right.copy()
    unwritten.view(np.uint32)[int(band.nan_at[1])] = POISON
    assert not within(unwritten, band, POISON)
    wrong_infinity = right.copy()
    wrong_infinity[1] = -np.inf
    assert not within(wrong_infinity, band, POISON)


def _slice(band: Band, i: int) -> Band:
    """Element i's band, as the band of a one-element output."""
    nan_at = np.zeros(1 if i in band.nan_at else 0, dtype=np.int64)
    return Band(lo=band.lo[i : i + 1], hi=band.hi[i : i + 1], nan_at=nan_at)
