"""Where kfactory keeps what it can rebuild: compiled kernels and device calibrations."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$KFACTORY_CACHE_DIR, else $XDG_CACHE_HOME/kfactory, else ~/.cache/kfactory."""
    base = os.environ.get("KFACTORY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kfactory"
    )
    return Path(base)
