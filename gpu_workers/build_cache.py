"""The content-keyed cache every back end's compiler keeps its builds in.

An entry is `<cache>/<key[:2]>/<key>/`: the built files and `meta.json`, the build's
record (a msgspec struct with a `cache_hit` field). A build runs in a fresh folder beside
the entries, moves its files into the entry when it succeeds, and the record is written
last, atomically. Concurrent builds of one key each finish (the later files replace the
earlier, identical ones), and a reader sees no record or a whole one.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

import msgspec

from gpu_workers.atomic_file import write_atomically

BuildT = TypeVar("BuildT", bound=msgspec.Struct)
FailureT = TypeVar("FailureT")

META_FILE = "meta.json"


def cache_key(parts: Sequence[str]) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def cached_build(
    cache: Path,
    key_parts: Sequence[str],
    kind: type[BuildT],
    files: Callable[[BuildT], Iterable[str]],
    build: Callable[[Path, Path], BuildT | FailureT],
) -> BuildT | FailureT:
    """The cached build of `key_parts` (everything the build depends on), with cache_hit
    set, when its record decodes as `kind` and all its `files` exist; else the result of
    `build(work, entry)`, which builds in the empty folder `work` (removed afterwards) and
    moves what it keeps into `entry`. A `kind` result is recorded; a failure is not."""
    key = cache_key(key_parts)
    entry = cache / key[:2] / key
    meta = entry / META_FILE
    cached = _read(meta, kind)
    if cached is not None and all(Path(f).is_file() for f in files(cached)):
        return msgspec.structs.replace(cached, cache_hit=True)
    entry.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=entry.parent))
    try:
        result = build(work, entry)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if isinstance(result, kind):
        write_atomically(meta, msgspec.json.encode(result))
    return result


def _read(meta: Path, kind: type[BuildT]) -> BuildT | None:
    try:
        return msgspec.json.decode(meta.read_bytes(), type=kind)
    except (OSError, msgspec.DecodeError):
        return None  # none yet, or written by an older version: build again
