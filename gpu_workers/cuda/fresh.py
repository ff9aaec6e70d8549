"""Fresh inputs for every timed call, and the choice of the timed calls whose outputs are
judged: the pure half (no GPU), used by the runner and replayed by tests and audits.

Before every timed call of a kernel (and of the incumbent) the runner overwrites the
input set the call is about to use with fresh values, on the device, outside the CUDA
events: the trusted kernel of refresh.cu draws each row at random, with replacement, from
a reservoir of input sets the problem itself generated on the host (so the values keep
the problem's distribution). A row is one element when the problem fills its inputs
element by element (independent values; `make_inputs` is None), else one run of the last
dimension (a problem with its own generator may normalise rows, as kda does). No call
sees the values of an earlier one, so no kernel can reuse earlier work, whether it keys
on the inputs' contents or on their pointers.

Which calls are judged is drawn from the job's secret seed by reservoir sampling
(`JudgeChoice`): every kernel call, warm-up included, is equally likely to be among the
JUDGED_CALLS judged, however many calls the run makes, and the runner copies the judged
calls' inputs (before the call) and outputs (after it) back to the host. The secret seed
comes back in the reply, so `judged_calls` and `refresh_key` replay the choice and the
keys of every refresh.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gpu_workers.atomic_file import write_atomically
from gpu_workers.compiler_process import run_compiler
from kernels.spec import Arg, Problem

MASK = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
REFRESH_SALT = 0x5EED_F7E5_4A11_0001
JUDGE_SALT = 0x5EED_7D6E_4A11_0002
JUDGED_CALLS = 3
"""Kernel calls whose outputs (and inputs) come back to be judged, chosen at random."""
UNIT_BYTES = 2
"""The refresh kernel moves 16-bit units."""
REFRESH_KERNEL = "kf_refresh"
REFRESH_SOURCE = Path(__file__).with_name("refresh.cu")
REFRESH_BLOCK = 256
REFRESH_MOST_BLOCKS = 1 << 16
COMPILE_TIMEOUT_S = 120.0

U64 = npt.NDArray[np.uint64]


def mix64(x: int) -> int:
    """splitmix64's output function of x + GAMMA (mod 2^64), as refresh.cu's kf_mix64."""
    z = (x + GAMMA) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def mix64_array(x: U64) -> U64:
    """mix64 of every element (numpy's uint64 arithmetic wraps, as the device's does)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def refresh_key(secret_seed: int, refresh: int, array: int) -> int:
    """The key of refresh number `refresh` (counted over the run) of input array `array`
    (its index among the problem's inputs)."""
    return mix64((mix64((mix64(secret_seed ^ REFRESH_SALT) + refresh) & MASK) + array) & MASK)


@dataclass(frozen=True)
class RowLayout:
    """An input array as the refresh kernel sees it: `rows` rows of `row_units` units."""

    rows: int
    row_units: int

    @property
    def units(self) -> int:
        return self.rows * self.row_units


def row_layout(problem: Problem, arg: Arg, shape: dict[str, int], itemsize: int) -> RowLayout:
    """Rows of one element where the problem draws every element on its own, else rows of
    the last dimension (a 1-D array of a problem with its own generator is one row)."""
    dims = arg.shape(shape)
    count = math.prod(dims)
    per_row = 1 if problem.make_inputs is None or not dims else dims[-1]
    if itemsize % UNIT_BYTES:
        raise ValueError(f"{itemsize}-byte elements do not split into {UNIT_BYTES}-byte units")
    if per_row == 0 or count == 0:
        return RowLayout(rows=0, row_units=per_row * itemsize // UNIT_BYTES)
    return RowLayout(rows=count // per_row, row_units=per_row * itemsize // UNIT_BYTES)


def refresh_sources(key: int, rows: int, sets: int) -> tuple[U64, U64]:
    """Per row of the result: the reservoir set and the row it is copied from."""
    r = np.arange(rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = mix64_array(np.uint64(key) + r)
    return h % np.uint64(sets), mix64_array(h) % np.uint64(max(1, rows))


def refresh_on_host(reservoir: npt.NDArray[Any], key: int, layout: RowLayout) -> npt.NDArray[Any]:
    """What kf_refresh writes, computed on the host: `reservoir` holds the sets' raw bits,
    one set per leading index; the result is one set's bits, flat."""
    sets = reservoir.shape[0]
    units = np.ascontiguousarray(reservoir).view(np.uint16).reshape(sets, -1)
    if units.shape[1] != layout.units:
        raise ValueError(f"a reservoir set holds {units.shape[1]} units, not {layout.units}")
    rows = units.reshape(sets, layout.rows, layout.row_units)
    s, src = refresh_sources(key, layout.rows, sets)
    out: npt.NDArray[Any] = rows[s.astype(np.int64), src.astype(np.int64)].reshape(-1)
    return out


def refresh_grid(layout: RowLayout) -> tuple[int, int, int]:
    """The refresh kernel's grid (a grid-stride loop: any grid covers the array)."""
    blocks = min(REFRESH_MOST_BLOCKS, max(1, -(-layout.units // REFRESH_BLOCK)))
    return (blocks, 1, 1)


class JudgeChoice:
    """Reservoir sampling of `slots` calls among all calls, offered in order 0, 1, 2, ...:
    after any number of calls each is held with the same probability."""

    def __init__(self, secret_seed: int, slots: int):
        if slots < 1:
            raise ValueError("at least one call must be judged")
        self.slots = slots
        self.base = mix64(secret_seed ^ JUDGE_SALT)
        self.calls = 0
        self.held: list[int] = []
        """The call each slot holds now."""

    def offer(self, call: int) -> int | None:
        """The slot call `call` is to be kept in (replacing the call held there), or None."""
        if call != self.calls:
            raise ValueError(f"call {call} offered after {self.calls} calls")
        self.calls += 1
        if call < self.slots:
            self.held.append(call)
            return call
        pick = mix64((self.base + call) & MASK) % (call + 1)
        if pick >= self.slots:
            return None
        self.held[pick] = call
        return pick


def judged_calls(secret_seed: int, slots: int, calls: int) -> list[int]:
    """The calls a run of `calls` kernel calls judged, by slot (a replay of JudgeChoice)."""
    choice = JudgeChoice(secret_seed, slots)
    for call in range(calls):
        choice.offer(call)
    return list(choice.held)


# The refresh kernel's build ---------------------------------------------------------------


class RefreshBuildError(RuntimeError):
    """nvcc could not build the harness's own refresh kernel (never a kernel's fault)."""


def refresh_cubin(nvcc: str, identity: str, arch: str, cache_dir: Path) -> Path:
    """The refresh kernel built by `nvcc` for `arch`, cached by source, arch and nvcc."""
    source = REFRESH_SOURCE.read_text()
    digest = hashlib.sha256("\0".join((source, arch, identity)).encode()).hexdigest()[:24]
    cubin = cache_dir / "refresh" / f"kf_refresh-{arch}-{digest}.cubin"
    if cubin.is_file():
        return cubin
    work = cache_dir / "refresh" / f"work-{os.getpid()}-{digest}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        (work / "refresh.cu").write_text(source)
        argv = [nvcc, "-cubin", f"-arch={arch}", "-O3", "refresh.cu", "-o", "refresh.cubin"]
        code, log = run_compiler(
            argv, work, timeout_s=COMPILE_TIMEOUT_S, address_space_bytes=8 << 30
        )
        built = work / "refresh.cubin"
        if code != 0 or not built.is_file():
            raise RefreshBuildError(
                f"nvcc failed to build the harness's refresh kernel for {arch} "
                f"(status {code}): {log[-2000:]}"
            )
        write_atomically(cubin, built.read_bytes())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return cubin
