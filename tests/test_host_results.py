"""bench/host_results.py keeps one row per kind of host: two CPUs that share a model name
(a virtual machine says "AMD EPYC" for a Zen 2 and a Zen 4) are told apart by their family
and model number, and rows measured before those were kept still render."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture
def host_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    module = importlib.import_module("host_results")
    monkeypatch.setattr(module, "RESULTS", tmp_path)
    monkeypatch.setattr(module, "TABLE_JSON", tmp_path / "hosts.json")
    monkeypatch.setattr(module, "TABLE_MD", tmp_path / "hosts.md")
    return module


def _as_host(module: ModuleType, monkeypatch: pytest.MonkeyPatch, family: str) -> None:
    kind = {"cpu_model": "AMD EPYC", "family_and_model": family, "isa": "AVX2", "cores": 2}
    monkeypatch.setattr(module, "host_kind", lambda: dict(kind))


def test_hosts_with_one_model_name_keep_rows_of_their_own(
    host_results: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    _as_host(host_results, monkeypatch, "family 23, model 49")
    host_results.record({"candidates_per_minute": 9.5}, "first host")
    _as_host(host_results, monkeypatch, "family 25, model 1")
    host_results.record({"candidates_per_minute": 11.0}, "second host")
    rows = host_results.load()
    assert set(rows) == {
        "AMD EPYC (family 23, model 49), AVX2, 2 cores",
        "AMD EPYC (family 25, model 1), AVX2, 2 cores",
    }
    table = host_results.TABLE_MD.read_text()
    assert "| AMD EPYC (family 23, model 49) | AVX2 | 2 |" in table
    assert "| 11.0 (" in table and "| 9.5 (" in table


def test_a_row_without_family_renders_and_a_figure_outside_the_table_is_refused(
    host_results: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = {"cpu_model": "AMD EPYC", "isa": "AVX2", "cores": 2, "figures": {}}
    assert host_results.key(old) == "AMD EPYC, AVX2, 2 cores"
    assert "| AMD EPYC | AVX2 | 2 | not measured |" in host_results.render({"k": old})
    with pytest.raises(ValueError, match="not a column"):
        host_results.record({"speedup_i_made_up": 9.0}, "nothing")


def test_this_hosts_family_and_model_come_from_proc_cpuinfo(host_results: ModuleType) -> None:
    if not Path("/proc/cpuinfo").exists() or sys.platform != "linux":
        pytest.skip("no /proc/cpuinfo on this host")
    found = host_results.family_and_model()
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    family = next((x.split(":")[1].strip() for x in lines if x.startswith("cpu family")), None)
    if family is None:
        assert found == ""  # an architecture whose cpuinfo names no family
    else:
        assert found.startswith(f"family {family}, model ")
