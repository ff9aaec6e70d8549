"""Rules the whole package keeps: nats-py stays inside `bus/` (every other package talks
to the bus through it), and no timeout can swallow a cancellation."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "eventstore", "gpu_workers", "kernels", "ops", "bench")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_only_bus_imports_nats() -> None:
    modules = [
        p
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    ]  # not what is installed beside the code (bench/.kt: Kernel Tuner for `make bench-kt`)
    assert len(modules) > len(PACKAGES)
    offenders = [str(p.relative_to(ROOT)) for p in modules if "nats" in _imports(p)]
    assert offenders == []
    assert "nats" in _imports(ROOT / "bus" / "connection.py")


def test_no_timeout_swallows_a_cancellation() -> None:
    """`asyncio.wait_for` loses a cancellation that arrives as its awaitable completes on
    Python 3.11 (CPython gh-86296): a lease's renewing task renewed for ever and a campaign
    stalled. The package's timeouts are `asyncio.timeout` blocks."""
    modules = [
        path
        for package in ("actors", "bus", "eventstore", "gpu_workers", "kernels", "ops")
        for path in (ROOT / package).rglob("*.py")
    ]
    assert ROOT / "bus" / "lease.py" in modules
    offenders = [
        str(path.relative_to(ROOT))
        for path in modules
        if any(
            isinstance(node, ast.Attribute) and node.attr == "wait_for"
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
        )
    ]
    assert offenders == []
