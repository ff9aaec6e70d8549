"""Rules the whole package keeps: nats-py stays inside `bus/` (every other package talks
to the bus through it); no role imports another role, and `actors/`' concerns import
one way (campaign, then search, then records and roles); no timeout can swallow a
cancellation."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "eventstore", "gpu_workers", "kernels", "ops", "bench")


def _modules_imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _modules_imported(path)}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


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


SHARED_BY_ROLES = {"actors.roles.messages"}
ROLES_DIR = ROOT / "actors" / "roles"


def test_no_role_imports_another_role() -> None:
    roles = {
        _module_name(p)
        for p in ROLES_DIR.glob("*.py")
        if p.stem not in {"__init__", "registry"} and _module_name(p) not in SHARED_BY_ROLES
    }
    assert {"actors.roles.planner", "actors.roles.verifier", "actors.roles.benchmarker"} <= roles
    offenders = {
        role: sorted(_modules_imported(ROLES_DIR / f"{role.rsplit('.', 1)[1]}.py") & roles)
        for role in roles
    }
    assert {role: found for role, found in offenders.items() if found} == {}


# What each concern of `actors/` may import of the others; runtime is everyone's.
ACTOR_CONCERNS = {
    "campaign": {"campaign"},
    "search": {"campaign", "search"},
    "records": {"campaign", "search", "records"},
    "roles": {"campaign", "search", "roles"},
}


def test_actor_concerns_import_one_way() -> None:
    offenders: list[str] = []
    for concern, allowed in ACTOR_CONCERNS.items():
        paths = list((ROOT / "actors" / concern).rglob("*.py"))
        assert paths, concern
        for path in paths:
            for name in _modules_imported(path):
                parts = name.split(".")
                if (
                    parts[0] == "actors"
                    and len(parts) > 1
                    and parts[1] != "runtime"
                    and parts[1] not in allowed
                ):
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []
    assert "actors.roles.messages" in _modules_imported(ROLES_DIR / "planner.py")
