"""The memory a kernel host shares with its driver: one memfd, and guarded buffers in it.

Every buffer has a guard page on each side (made PROT_NONE in the kernel's process only)
and canary bytes in whatever lies between its data and those pages, on both sides. Where
in its pages a buffer starts varies between layouts (64-byte steps): right after the
guard page before it, as close to the guard page after it as alignment allows, or
anywhere between, so a read past either end faults in some layouts, and a kernel cannot
count on the slack around its data; a timed contender's buffers move before every call
(`moved`). An input's pages are read-only in the kernel's process (`read_only_ranges`):
the driver writes them through its own mapping. A canary word is a huge finite float
(0x5A5A5A5A, about 1.5e16): read into a max or a sum, it ruins the result.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

PAGE = mmap.PAGESIZE
ALIGN = 64
ITEMSIZE = 4
"""Bytes per element: CPU kernels take float32 arrays."""
CANARY = 0x5A


def poison(array: npt.NDArray[np.float32], bits: int) -> None:
    """Fill an output with one NaN payload, so that what the kernel did not write shows."""
    array.view(np.uint32)[...] = np.uint32(bits)


def _pages(nbytes: int) -> int:
    return -(-nbytes // PAGE) * PAGE


@dataclass(frozen=True)
class Slot:
    """One buffer: `offset` of its data in the arena, inside [start, end) between guards."""

    offset: int
    nbytes: int
    start: int
    end: int
    shape: tuple[int, ...]


def slot_bytes(nbytes: int) -> int:
    """Arena bytes one buffer of `nbytes` takes: its pages, an alignment spare, two guards."""
    return _pages(max(nbytes, 1) + PAGE) + 2 * PAGE


def _placed(start: int, end: int, nbytes: int, rng: np.random.Generator) -> int:
    """Where a buffer of `nbytes` starts between `start` and `end`: against either end, or
    anywhere between, in 64-byte steps."""
    room = (end - start - nbytes) // ALIGN
    step = (0, room, int(rng.integers(0, room + 1)))[int(rng.integers(0, 3))]
    return start + ALIGN * step


def layout(
    shapes: Sequence[tuple[int, ...]], itemsize: int, rng: np.random.Generator, base: int = 0
) -> list[Slot]:
    """Consecutive guarded slots from `base`, each buffer at a random 64-byte offset."""
    slots = []
    at = base
    for shape in shapes:
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize if shape else itemsize
        span = slot_bytes(nbytes)
        start, end = at + PAGE, at + span - PAGE
        offset = _placed(start, end, nbytes, rng)
        slots.append(Slot(offset=offset, nbytes=nbytes, start=start, end=end, shape=shape))
        at += span
    return slots


def moved(slots: Sequence[Slot], rng: np.random.Generator) -> list[Slot]:
    """The same slots, each buffer placed afresh between its guards: where one buffer
    starts relative to another (their addresses modulo 4 KiB) changed a softmax's time
    by up to 15%, so a run that kept one layout per contender ranked them by its luck."""
    return [
        Slot(_placed(s.start, s.end, s.nbytes, rng), s.nbytes, s.start, s.end, s.shape)
        for s in slots
    ]


def guard_ranges(slots: Sequence[Slot]) -> list[tuple[int, int]]:
    return [r for s in slots for r in ((s.start - PAGE, PAGE), (s.end, PAGE))]


def read_only_ranges(
    names: Sequence[str], outputs: Sequence[bool], slots: Sequence[Slot]
) -> list[tuple[str, int, int]]:
    """(name, offset, length) of each input's pages between its guards: read-only in the
    kernel's process, so a write to an input faults and is named."""
    return [
        (name, s.start, s.end - s.start)
        for name, out, s in zip(names, outputs, slots, strict=True)
        if not out
    ]


class Arena:
    """A shared memory file of `nbytes`, mapped here read-write."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = _pages(max(nbytes, PAGE))
        # close-on-exec: only the host it is handed to (as fd 3) gets it, no other child
        self.fd = os.memfd_create("kf-arena", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.nbytes)
        self._map = mmap.mmap(self.fd, self.nbytes)
        self.bytes: npt.NDArray[np.uint8] = np.frombuffer(self._map, dtype=np.uint8)

    def floats(self, slot: Slot) -> npt.NDArray[np.float32]:
        """The float32 array in `slot` (a view of the shared memory)."""
        raw = self.bytes[slot.offset : slot.offset + slot.nbytes]
        return raw.view(np.float32).reshape(slot.shape)

    def fill_canaries(self, slots: Sequence[Slot]) -> None:
        for s in slots:
            self.bytes[s.start - PAGE : s.offset] = CANARY
            self.bytes[s.offset + s.nbytes : s.end + PAGE] = CANARY

    def damaged(self, slot: Slot) -> str | None:
        """'before' or 'after' where a canary around `slot` changed, else None."""
        if np.any(self.bytes[slot.start - PAGE : slot.offset] != CANARY):
            return "before"
        if np.any(self.bytes[slot.offset + slot.nbytes : slot.end + PAGE] != CANARY):
            return "after"
        return None

    def close(self) -> None:
        self.bytes = np.empty(0, dtype=np.uint8)
        with contextlib.suppress(BufferError):  # views still alive: it goes with the last
            self._map.close()
        os.close(self.fd)
