"""The systemd units and the environment file of ops/deploy/ say only what the code does:
units systemd accepts, commands and options that exist, and every variable the code
reads (and no other) in the environment file."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from ops.cli import app

DEPLOY = Path(__file__).parent.parent / "ops" / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
SOURCES = ("actors", "bus", "eventstore", "kernels", "gpu_workers", "ops")
#: The variable a campaign's `writer.api_key_env` names by default
#: (actors/campaign/campaign_file.py).
LLM_KEY = "OPENAI_API_KEY"


def _read_variables() -> set[str]:
    """Names the code reads from its environment: os.environ.get("X"), os.environ["X"],
    and constants it reads through (`NVCC_ENV = "X"`, the CUDA_ENV tuple)."""
    root = DEPLOY.parent.parent
    found: set[str] = set()
    for package in SOURCES:
        for path in (root / package).rglob("*.py"):
            text = path.read_text()
            found |= set(re.findall(r'os\.environ(?:\.get)?[(\[]\s*"([A-Z][A-Z0-9_]+)"', text))
            found |= set(re.findall(r'^[A-Z_]*ENV = "([A-Z][A-Z0-9_]+)"', text, re.M))
            for block in re.findall(r"^CUDA_ENV = \(([^)]*)\)", text, re.M):
                found |= set(re.findall(r'"([A-Z][A-Z0-9_]+)"', block))
    return found - {"PATH", "LANG", "XDG_CACHE_HOME"}  # the system's own


def _shown_variables() -> set[str]:
    text = (DEPLOY / "kfactory.env").read_text()
    return set(re.findall(r"^#?([A-Z][A-Z0-9_]+)=", text, re.M)) | set(
        re.findall(r"\b(CUDA_[A-Z_]+|NVIDIA_[A-Z_]+|LD_LIBRARY_PATH)\b", text)
    )


def test_the_environment_file_shows_every_setting_the_code_reads() -> None:
    read = _read_variables()
    assert {"KF_HOME", "KF_NATS_URL", "KF_CREDS", "KF_TLS_CA", "KFACTORY_CC"} <= read
    shown = _shown_variables()
    assert read - shown == set(), "read by the code, missing from kfactory.env"
    assert shown - read - {LLM_KEY} == set(), "in kfactory.env, read by nothing"


def test_the_units_run_commands_and_options_that_exist() -> None:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for unit in UNITS:
        line = next(x for x in unit.read_text().splitlines() if x.startswith("ExecStart="))
        words = line.split()
        program = Path(words[0].removeprefix("ExecStart=")).name
        if program == "nats-server":
            assert words[1:3] == ["-c", "/etc/kfactory/nats/%i.conf"], unit.name
            continue
        assert program == "kfactory", unit.name
        command = commands[words[1]]
        options = {o for p in command.params for o in p.opts}
        given = [w for w in words[2:] if w.startswith("--")]
        assert set(given) <= options, f"{unit.name}: {set(given) - options}"
        for variable in re.findall(r"\$\{?([A-Z_]+)", line):
            assert variable in _shown_variables() or variable == "ACTOR_OPTIONS", variable


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_accepts_every_unit(tmp_path: Path) -> None:
    venv = str(Path(sys.executable).parent.parent)
    for unit in UNITS:  # with this checkout's venv in place of /opt/kfactory/venv
        name = unit.name.replace("@.", "@n1.") if "@." in unit.name else unit.name
        (tmp_path / name).write_text(unit.read_text().replace("/opt/kfactory/venv", venv))
    checked = subprocess.run(
        ["systemd-analyze", "verify", *sorted(str(p) for p in tmp_path.iterdir())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0 and checked.stderr.strip() == "", checked.stderr
