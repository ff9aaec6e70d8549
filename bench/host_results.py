"""The per-host results table: one row per kind of host measured, kept in git.

A figure from one kind of host says nothing of another (an AVX2 EPYC and an AVX-512 Xeon
rank the same kernels differently), so each bench that measures a headline figure adds
it to its host kind's row: `record(figures, command)`. The kind is the CPU model with its
family and model number (a virtual machine's model name can hide the generation: a Zen 2
and a Zen 4 EPYC are both "AMD EPYC"), its widest vector ISA (AVX-512 where the CPU flags
list avx512f, else AVX2, else SSE) and its core count. The rows live in
`bench/results/hosts.json` and are rendered to `bench/results/hosts.md`, the two files of
bench/results/ that git keeps; `make bench-host` measures this host's whole row.

Usage: python bench/host_results.py    # prints the table (and this host's kind)
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_workers.cpu.calibrate import cpu_model  # noqa: E402
from kernels.host_isa import cpuinfo, host_has  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TABLE_JSON = RESULTS / "hosts.json"
TABLE_MD = RESULTS / "hosts.md"

COLUMNS: dict[str, tuple[str, str]] = {
    "promoted_best_vs_kernel_tuner": ("promoted best vs Kernel Tuner's best", "{:.2f}x"),
    "fastest_of_top_n_vs_promoted": (
        "promoted best's time over the fastest of the top N (median per round)",
        "{:.3f}",
    ),
    "of_softmax_bound": (
        "promoted best, of the bound max(fastest copy call, softmax arithmetic)",
        "{:.0%}",
    ),
    "of_bound_in_its_round": (
        "promoted best, of that bound with the copy of its own round (median per round)",
        "{:.0%}",
    ),
    "of_exp_bound": ("promoted best, of the looser max(copy, exps alone)", "{:.0%}"),
    "of_copy_in_this_run": ("promoted best, of the copy timed beside it", "{:.0%}"),
    "hand_best_vs_kernel_tuner": ("best hand kernel vs Kernel Tuner's best", "{:.2f}x"),
    "candidates_per_minute": ("candidates per minute (softmax 4096²)", "{:.1f}"),
}
"""The figures a row may hold (title, format), in the order the table shows them."""


def isa() -> str:
    if host_has("avx512f"):
        return "AVX-512"
    if host_has("avx2"):
        return "AVX2"
    return "SSE"


def family_and_model() -> str:
    """The CPU's family and model number from /proc/cpuinfo ("" where it does not say)."""
    fields = cpuinfo()
    if "cpu family" not in fields or "model" not in fields:
        return ""
    return f"family {fields['cpu family']}, model {fields['model']}"


def host_kind() -> dict[str, Any]:
    return {
        "cpu_model": cpu_model(),
        "family_and_model": family_and_model(),
        "isa": isa(),
        "cores": os.cpu_count() or 1,
    }


def cpu_name(kind: dict[str, Any]) -> str:
    family = kind.get("family_and_model")  # rows measured before it was kept lack it
    return f"{kind['cpu_model']} ({family})" if family else str(kind["cpu_model"])


def key(kind: dict[str, Any]) -> str:
    return f"{cpu_name(kind)}, {kind['isa']}, {kind['cores']} cores"


def load() -> dict[str, dict[str, Any]]:
    return json.loads(TABLE_JSON.read_text()) if TABLE_JSON.exists() else {}


def record(figures: dict[str, float], command: str) -> Path:
    """Add `figures` (names from COLUMNS) to this host kind's row, measured by `command`;
    rewrite the table. Returns the Markdown file."""
    unknown = set(figures) - set(COLUMNS)
    if unknown:
        raise ValueError(f"not a column of the host table: {sorted(unknown)}")
    rows = load()
    kind = host_kind()
    row = rows.setdefault(key(kind), {**kind, "figures": {}})
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    for name, value in figures.items():
        row["figures"][name] = {
            "value": value,
            "measured": when,
            "command": command,
            "load_average": [round(v, 2) for v in os.getloadavg()],
        }
    RESULTS.mkdir(parents=True, exist_ok=True)
    TABLE_JSON.write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")
    TABLE_MD.write_text(render(rows))
    return TABLE_MD


def _cell(name: str, figures: dict[str, dict[str, Any]]) -> str:
    if name not in figures:
        return "not measured"
    return f"{COLUMNS[name][1].format(figures[name]['value'])} ({figures[name]['measured']})"


def render(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "# Results per host kind",
        "",
        "Written by `bench/host_results.py` from the benches that measure these figures; "
        "each cell gives the date measured, and `hosts.json` the command and load average.",
        "Ratios are taken within one interleaved run on that host; a figure from one kind of "
        "host says nothing of another.",
        "",
        "| CPU | ISA | cores | " + " | ".join(title for title, _ in COLUMNS.values()) + " |",
        "|---|---|---|" + "---|" * len(COLUMNS),
    ]
    for row in (rows[name] for name in sorted(rows)):
        cells = [cpu_name(row), row["isa"], str(row["cores"])]
        cells += [_cell(name, row["figures"]) for name in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(f"this host: {key(host_kind())}\n")
    print(render(load()), end="")
