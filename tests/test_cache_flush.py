"""The cache flush timing runs before every call: it builds on this host, evicting lines
never changes a byte, whatever the alignment and length of the range, and the neutral bench
harness flushes with the same build.

That it evicts is measured, not asserted (no test here depends on this host's speed):
`bench/softmax_limit.py` times the calibration's copy at the calibrated, beyond-cache
bandwidth with the flush, on a host whose cache holds the whole workload."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from gpu_workers.cpu.trusted_build import cache_flush_library
from tests.cpu_support import kf_cache

__all__ = ["kf_cache"]

ROOT = Path(__file__).resolve().parent.parent


def test_flushing_any_range_leaves_every_byte_as_it_was(kf_cache: Path) -> None:
    flush = ctypes.CDLL(str(cache_flush_library(kf_cache / "cpu-kernels"))).kf_flush
    flush.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    flush.restype = None
    data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)
    before = data.copy()
    base = data.ctypes.data
    for start, length in ((0, data.size), (1, 63), (63, 2), (4095, 70_001), (17, (2 << 20) + 5)):
        data[start : start + length] += 1  # dirty lines, written back by the flush
        flush(base + start, length)
        before[start : start + length] += 1
        np.testing.assert_array_equal(data, before)
    flush(base, 0)  # an empty range
    np.testing.assert_array_equal(data, before)


def test_the_neutral_bench_harness_flushes_with_the_same_library(tmp_path: Path) -> None:
    script = (
        "import sys; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/bench']\n"
        "import numpy as np, native_harness as h\n"
        "a = np.arange(1 << 20, dtype=np.float32); b = a.copy(); h.flush_caches(a)\n"
        "assert (a == b).all()\n"
        "print(h._flush.cache_info().currsize)\n"
    )
    env = {**os.environ, "KFACTORY_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script, str(ROOT)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    assert list(tmp_path.rglob("libkf-cache-flush.so")), "not the timing runs' build"
