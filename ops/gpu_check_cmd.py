"""`kfactory gpu-check`: short cuda campaigns per problem on this host's GPU, as a table.

Everything runs in this process on a fresh hub in --out (so the events of the check stay
there to query and audit): the campaigns run one after another, each with a small budget,
and a table compares the best verified kernel of each with the baseline users run today
(torch eager, else cupy, else the naive kernel) and with the GPU's measured roofline.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from actors.campaign.campaign_file import Budget, CampaignSpec, Search, validate
from gpu_workers.targets import calibration_for, device_missing
from ops.errors import UserError
from ops.hub import running_hub
from ops.logging import quiet_logs
from ops.output import to_json
from ops.run_cmd import follow_campaign
from ops.swarm import running_swarm

CHECKS: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("softmax", "bf16", (8192, 8192)),
    ("rmsnorm", "bf16", (8192, 8192)),
    ("layernorm", "bf16", (8192, 8192)),
    ("gelu", "bf16", (8192 * 8192,)),
    ("residual_rmsnorm_gelu", "bf16", (8192, 8192)),
    ("matmul", "fp32", (4096, 4096, 4096)),
    ("matmul", "bf16", (4096, 4096, 4096)),
    ("kda", "fp32", ()),
)
"""(problem, dtype, timed shape in the problem's dim order; empty: its default shape)."""

HELP = (
    "Check the cuda target on this host's GPU: one short campaign per problem, then a "
    "table of the best verified kernel of each against the baseline (torch eager where "
    "installed, else cupy, else the naive kernel) and the GPU's roofline.\n\n"
    "The events of every campaign stay in --out/events.duckdb; the table is also written "
    "to --out/gpu-check.json. Needs a CUDA GPU and pycuda (pip install '.[cuda]'); on a "
    "fresh host with no network, run ops/gpu_check.sh instead.\n\n"
    "Examples:\n\n"
    "  kfactory gpu-check\n\n"
    "  kfactory gpu-check --only softmax:bf16 --only matmul:fp32 --budget 12"
)


def register(app: typer.Typer) -> None:
    app.command("gpu-check", help=HELP)(gpu_check)


def gpu_check(
    out: Path = typer.Option(Path("gpu-check"), help="Folder for events.duckdb and the JSON."),
    only: list[str] = typer.Option(
        [], help="PROBLEM:DTYPE to check (repeatable); default: all of them."
    ),
    budget: int = typer.Option(8, min=1, help="Candidates per campaign."),
    deadline: float = typer.Option(
        240.0, min=1.0, help="Seconds for all campaigns; those not started by then are skipped."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON instead of the table."),
) -> None:
    missing = device_missing("cuda", "benchmarker")
    if missing is not None:
        raise UserError(f"no GPU to check here: {missing}")
    checks = _chosen(only)
    quiet_logs()
    console = Console(stderr=True, quiet=as_json)
    out.mkdir(parents=True, exist_ok=True)
    calibration = calibration_for("cuda")
    console.print(
        f"{calibration.cpu_model}: copy {calibration.memory_bandwidth_gbs:.0f} GB/s, "
        f"fp32 {calibration.peak_fp32_gflops / 1e3:.1f} TFLOP/s, "
        + ", ".join(
            f"{k} {v / 1e3:.0f} TFLOP/s" for k, v in calibration.peak_gflops_by_dtype.items()
        )
    )
    rows = asyncio.run(_run(checks, out, budget, deadline, console))
    report = {
        "device": calibration.cpu_model,
        "copy_bandwidth_gbs": calibration.memory_bandwidth_gbs,
        "peak_gflops": {"fp32": calibration.peak_fp32_gflops, **calibration.peak_gflops_by_dtype},
        "rows": rows,
    }
    (out / "gpu-check.json").write_text(to_json(report))
    if as_json:
        print(to_json(report))
        return
    table = Table(title=f"gpu check: {calibration.cpu_model}")
    for column in (
        "problem",
        "dtype",
        "best median ms",
        "speedup",
        "baseline",
        "roofline",
        "evaluated",
        "rejections",
    ):
        table.add_column(column)
    for row in rows:
        best = row.get("best") or {}
        table.add_row(
            row["problem"],
            row["dtype"],
            f"{best['median_ns'] / 1e6:.3f}" if best else "-",
            f"{best['speedup']:.2f}x" if best else "-",
            best.get("baseline", "-") if best else "-",
            f"{best['roofline_fraction']:.0%}" if best else "-",
            str(row.get("evaluated", 0)),
            ", ".join(f"{k} {v}" for k, v in row.get("rejected_by_stage", {}).items()) or "-",
        )
    Console().print(table)
    console.print(f"JSON: {out / 'gpu-check.json'}; events: {out / 'events.duckdb'}")


def _chosen(only: list[str]) -> list[tuple[str, str, tuple[int, ...]]]:
    if not only:
        return list(CHECKS)
    known = {f"{p}:{d}": (p, d, s) for p, d, s in CHECKS}
    unknown = [o for o in only if o not in known]
    if unknown:
        raise UserError(f"unknown checks {unknown}; choose from {', '.join(known)}")
    return [known[o] for o in only]


async def _run(
    checks: list[tuple[str, str, tuple[int, ...]]],
    out: Path,
    budget: int,
    deadline: float,
    console: Console,
) -> list[dict[str, Any]]:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    async with (
        running_hub(out) as hub,
        running_swarm(hub.url, target="cuda", auth=hub.auth) as swarm,
    ):
        for problem, dtype, shape in checks:
            row: dict[str, Any] = {"problem": problem, "dtype": dtype}
            if stop.is_set() or time.monotonic() - started > deadline:
                rows.append({**row, "skipped": "the check's deadline passed first"})
                continue
            spec = validate(
                CampaignSpec(
                    problem=problem,
                    name=f"gpu-check-{problem}-{dtype}".replace("_", "-"),
                    target="cuda",
                    dtype=dtype,
                    shapes=[list(shape)] if shape else [],
                    budget=Budget(candidates=budget),
                    search=Search(per_generation=budget),
                )
            )
            result = await follow_campaign(
                spec, hub.url, hub.auth("cli"), swarm, stop, console, hub.check
            )
            rows.append({**row, **(result or {"skipped": "stopped"})})
    return rows
