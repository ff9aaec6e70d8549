"""A kernel's identity: the hash of its source and the flags it is built with."""

from __future__ import annotations

import hashlib


def source_hash(source: str, flags: list[str] | tuple[str, ...]) -> str:
    """The identity of a kernel: its source and the flags it is built with."""
    return hashlib.sha256(("// flags: " + " ".join(flags) + "\n" + source).encode()).hexdigest()
