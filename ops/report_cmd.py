"""`kfactory report CAMPAIGN -o report.html`: one self-contained HTML file."""

from __future__ import annotations

from pathlib import Path

import typer

from eventstore.events import SYSTEM_CAMPAIGN, HostCalibrated
from gpu_workers.atomic_file import write_atomically
from ops.options import HOME
from ops.store_access import open_history, rebuild_campaign

REPORT_HELP = """Write a campaign's report as one HTML file that opens with no network.

It holds the best-so-far curve over evaluations and over time; a roofline chart of every timed kernel under the ceilings calibrated on the host that timed it; the leaderboard with parameters, median, IQR and sources; the lessons, each linked to the events it cites; the rejections by stage and generation; the lineage of each kernel made from parents (operator, parameters, parents, outcome, diff); and the winning kernel's source with its lineage, highlighted. The charts are plotly with its JavaScript inlined.

Examples:

  kfactory report demo-softmax -o report.html

  kfactory report demo-softmax -o /tmp/r.html && chromium /tmp/r.html
"""  # noqa: E501


def report(
    campaign: str = typer.Argument(..., help="The campaign id (its name)."),
    output: Path = typer.Option(Path("report.html"), "--output", "-o", help="The HTML file."),
    home: Path | None = HOME,
) -> None:
    with open_history(home) as snapshot:
        rebuilt = rebuild_campaign(snapshot, campaign)
        calibrations = [
            e
            for _, e in snapshot.events(SYSTEM_CAMPAIGN, types=["HostCalibrated"])
            if isinstance(e, HostCalibrated)
        ]
    from ops.report import render_report  # plotly: loaded by this command only

    page = render_report(rebuilt, calibrations)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(output, page.encode())
    print(f"{output}: {len(page) / 1e6:.1f} MB, self-contained")


def register(app: typer.Typer) -> None:
    app.command("report", help=REPORT_HELP)(report)
