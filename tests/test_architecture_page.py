"""`docs/architecture.md` stays true to the code: it names every module of the product
packages, and every module it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGES = ("actors", "bus", "eventstore", "kernels", "gpu_workers", "ops")
SUFFIXES = (".py", ".c", ".cu")
_NAMED = re.compile(r"`([\w/.]+\.(?:py|c|cu))`")


def _modules() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*")
        if path.suffix in SUFFIXES
        and path.name != "__init__.py"
        and "examples" not in path.parts
        and "__pycache__" not in path.parts
    )


def _sections() -> dict[str, str]:
    """The page's text under each `### \\`package/\\`` heading, by package."""
    parts = re.split(r"^### `(\w+)/`$", PAGE.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_module_is_on_the_page() -> None:
    sections = _sections()
    assert set(sections) == set(PACKAGES)
    modules = _modules()
    assert len(modules) > 100
    missing = [
        str(path.relative_to(ROOT))
        for path in modules
        if f"`{path.relative_to(ROOT / path.relative_to(ROOT).parts[0]).as_posix()}`"
        not in sections[path.relative_to(ROOT).parts[0]]
    ]
    assert missing == []


def test_every_module_the_page_names_exists() -> None:
    named = {
        (package, name) for package, text in _sections().items() for name in _NAMED.findall(text)
    }
    assert ("actors", "campaign/leaderboard.py") in named
    assert [f"{p}/{name}" for p, name in sorted(named) if not (ROOT / p / name).is_file()] == []
