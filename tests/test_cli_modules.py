"""The command line never drops a command whose module fails to import: it refuses to
start, naming the module and why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer

from ops.cli import COMMAND_MODULES, BrokenCommandModule, register_commands


def test_a_missing_command_module_is_an_error_that_names_it() -> None:
    with pytest.raises(BrokenCommandModule, match=r"ops\.no_such_cmd cannot be imported"):
        register_commands(typer.Typer(), ("ops.sql_cmd", "ops.no_such_cmd"))


def test_a_module_whose_own_imports_fail_is_named_with_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kf_broken_cmd.py").write_text(
        "import kf_not_installed_anywhere\n\ndef register(app):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BrokenCommandModule) as raised:
        register_commands(typer.Typer(), ("kf_broken_cmd",))
    assert raised.value.name == "kf_broken_cmd"
    assert "kf_broken_cmd cannot be imported" in str(raised.value)
    assert "No module named 'kf_not_installed_anywhere'" in str(raised.value)


def test_kfactory_does_not_start_without_one_of_its_command_modules() -> None:
    broken = COMMAND_MODULES[0]  # the first: nothing else is imported before it fails
    started = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.modules[{broken!r}] = None\n"
            "from ops.cli import main\nsys.exit(main(['--help']))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode != 0
    assert f"BrokenCommandModule: the command module {broken} cannot be imported" in started.stderr
