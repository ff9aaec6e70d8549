"""Rules the whole package keeps: nats-py stays inside `bus/` (every other package talks
to the bus through it); no role imports another role, and `actors/`' concerns import
one way (campaign, then search, then records and roles); no role branches on the
campaign's writer kind (the search strategies' registry does); no timeout can swallow a
cancellation; nothing outside `gpu_workers/` branches on a target's name (callers ask
the target map, `gpu_workers.targets`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gpu_workers.targets import TARGETS

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
                concern = parts[1] if parts[0] == "actors" and len(parts) > 1 else "runtime"
                if concern != "runtime" and concern not in allowed:
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []
    assert "actors.roles.messages" in _modules_imported(ROLES_DIR / "planner.py")


def _writer_kind_branches(source: str) -> list[int]:
    """The lines that compare or match on a `writer.kind`."""
    found: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            tested = [node.left, *node.comparators]
        elif isinstance(node, ast.Match):
            tested = [node.subject]
        else:
            continue
        if any(
            isinstance(part, ast.Attribute)
            and part.attr == "kind"
            and isinstance(part.value, ast.Attribute)
            and part.value.attr == "writer"
            for expression in tested
            for part in ast.walk(expression)
        ):
            found.append(node.lineno)
    return sorted(found)


def test_no_role_branches_on_the_writer_kind() -> None:
    """A campaign's generations are filled by the strategy `actors.search.registry` names
    for its writer kind: a new strategy needs no role to change."""
    planted = (
        "def fill(spec):\n"
        "    if spec.writer.kind == 'llm':\n"
        "        return 1\n"
        "    match campaign.spec.writer.kind:\n"
        "        case 'template':\n"
        "            return 2\n"
        "    return 3 if 'llm' != spec.writer.kind else 4\n"
    )
    assert _writer_kind_branches(planted) == [2, 4, 7]
    offenders = {
        str(path.relative_to(ROOT)): lines
        for path in ROLES_DIR.rglob("*.py")
        if (lines := _writer_kind_branches(path.read_text()))
    }
    assert offenders == {}


BRANCH_FREE = ("actors", "eventstore", "kernels", "ops", "bus")
"""The packages that ask the target map (or, below `gpu_workers/`, a per-target table)."""
_JINJA_TAG = re.compile(r"\{%.*?%\}|\{\{.*?\}\}", re.DOTALL)
_QUOTED = re.compile(r"""["']([^"']*)["']""")


def _names_a_target(node: ast.AST) -> bool:
    """A target's name as a string constant, or a literal collection holding one."""
    if isinstance(node, ast.Constant):
        return node.value in TARGETS
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_target(element) for element in node.elts)
    if isinstance(node, ast.Dict):
        return any(key is not None and _names_a_target(key) for key in node.keys)
    return False


def _jinja_compares_a_target(text: str) -> bool:
    """A jinja tag that compares with a quoted target name (`{% if target == "cpu" %}`)."""
    return any(
        re.search(r"==|!=|\bin\b", tag) and set(_QUOTED.findall(tag)) & set(TARGETS)
        for tag in _JINJA_TAG.findall(text)
    )


def _branches_on_a_target(node: ast.AST) -> bool:
    if isinstance(node, ast.Compare):
        compares = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)
        return any(isinstance(op, compares) for op in node.ops) and any(
            _names_a_target(side) for side in (node.left, *node.comparators)
        )
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in {"startswith", "endswith"} and any(
            _names_a_target(argument) for argument in node.args
        )
    if isinstance(node, ast.MatchValue):
        return _names_a_target(node.value)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _jinja_compares_a_target(node.value)
    return False


def target_branches(source: str) -> list[int]:
    """The lines of `source` that branch on a target's name: a comparison (==, !=, in,
    not in, is) with one, `.startswith`/`.endswith` of one, a `case` of one, or a jinja
    template in a string that compares with one."""
    return sorted(
        node.lineno for node in ast.walk(ast.parse(source)) if _branches_on_a_target(node)
    )


PLANTED_BRANCHES = (
    'if target == "cuda":\n    pass',
    'ok = "cpu" != spec.target',
    'ok = target in ("cuda", "rocm")',
    'ok = target not in ["cpu"]',
    'ok = target.startswith("cuda")',
    'match target:\n    case "cpu":\n        pass',
    "PROMPT = '''{% if target == \"cpu\" -%}C{%- endif %}'''",
    "PROMPT = \"{{ 'C' if target == 'cuda' else '' }}\"",
)
NOT_BRANCHES = (
    'SUFFIX = {"cpu": ".c", "cuda": ".cu"}',
    'backend = backend_for("cuda")',
    'ok = target == "cpus"',
    "ok = target == spec.target",
    'PROMPT = "{% if llm_brief %}{{ llm_brief }}{% endif %} on cpu"',
)


def test_the_target_branch_finder_sees_every_form_of_a_branch() -> None:
    assert {"cpu", "cuda"} <= set(TARGETS)
    assert [source for source in PLANTED_BRANCHES if not target_branches(source)] == []
    assert [source for source in NOT_BRANCHES if target_branches(source)] == []


def test_nothing_outside_gpu_workers_branches_on_a_target_name() -> None:
    paths = [p for package in BRANCH_FREE for p in (ROOT / package).rglob("*.py")]
    assert ROOT / "ops" / "check_cmd.py" in paths
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in paths
        for line in target_branches(path.read_text())
    ]
    templates = [p for package in BRANCH_FREE for p in (ROOT / package).rglob("*.j2")]
    assert templates
    offenders += [
        str(path.relative_to(ROOT))
        for path in templates
        if _jinja_compares_a_target(path.read_text())
    ]
    assert offenders == []
