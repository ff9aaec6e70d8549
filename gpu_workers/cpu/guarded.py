"""Kernel buffers that fault on overrun: each array ends as close to a PROT_NONE page as
64-byte alignment of its start allows. The few slack bytes left are filled with a canary."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import numpy.typing as npt

PAGE = mmap.PAGESIZE
ALIGN = 64
CANARY_BITS = 0x7FCA5A5A
PROT_NONE, PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE
MAP_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


class GuardedArray:
    """A float32 array placed right before a guard page (and after another one)."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        count = int(np.prod(shape)) if shape else 1
        nbytes = count * 4
        padded = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        data_pages = -(-padded // PAGE)
        self._total = (data_pages + 2) * PAGE
        base = _libc.mmap(None, self._total, PROT_RW, MAP_FLAGS, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            raise MemoryError(f"mmap of {self._total} bytes failed")
        self._base = int(base)
        _libc.mprotect(self._base, PAGE, PROT_NONE)
        _libc.mprotect(self._base + (data_pages + 1) * PAGE, PAGE, PROT_NONE)
        end = self._base + (data_pages + 1) * PAGE
        self.address = end - padded
        self.slack_words = (padded - nbytes) // 4
        whole = (ctypes.c_uint32 * (padded // 4)).from_address(self.address)
        self._words = np.ctypeslib.as_array(whole)
        self.array: npt.NDArray[np.float32] = self._words[:count].view(np.float32).reshape(shape)
        self._words[count:] = CANARY_BITS

    def slack_intact(self) -> bool:
        count = self._words.size - self.slack_words
        return bool(np.all(self._words[count:] == CANARY_BITS))

    def release(self) -> None:
        self.array = np.empty(0, dtype=np.float32)
        self._words = np.empty(0, dtype=np.uint32)
        _libc.munmap(self._base, self._total)


def aligned_empty(shape: tuple[int, ...], align: int = ALIGN) -> npt.NDArray[np.float32]:
    """A float32 array whose first element is `align`-byte aligned (for timing buffers)."""
    count = int(np.prod(shape)) if shape else 1
    raw = np.empty(count * 4 + align, dtype=np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset : offset + count * 4].view(np.float32).reshape(shape)
