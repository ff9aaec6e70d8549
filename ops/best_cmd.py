"""`kfactory best CAMPAIGN`: write the winning kernel (or the top N) as checkable files."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from actors.campaign.leaderboard import campaign_leaderboard
from actors.records.best_kernels import describe, file_name, kernel_text, write_kernel
from actors.search.lineage import lineage_of
from ops.errors import UserError
from ops.options import HOME, JSON
from ops.output import to_json
from ops.store_access import open_history, rebuild_campaign

BEST_HELP = """Write a campaign's best verified kernel (the one that won its head-to-head run against the previous best; the others follow by their own time): its source after a `// kfactory-flags:` line and a provenance comment, so that `kfactory check` and a plain compiler take the file as it is.

Without -o the source goes to standard output. With --top N the best and the next N-1 by their own time are written into the folder -o names (default ./best-CAMPAIGN), as 01-<candidate>.c, 02-.... The text output gives each kernel's time (the median over every run that timed it: its own, and each head-to-head run that timed it as the best; the IQR of its own run), the number of those runs, and its speedup over the campaign's baseline (the median of its candidates' baseline medians), and that baseline with its spread.

Examples:

  kfactory best demo-softmax -o softmax.c && kfactory check softmax --source softmax.c

  kfactory best demo-softmax --top 3 -o winners/

  kfactory best demo-softmax -o softmax.c --json
"""  # noqa: E501


def best(
    campaign: str = typer.Argument(..., help="The campaign id (its name)."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="File to write (a folder with --top)."
    ),
    top: int = typer.Option(1, "--top", min=1, help="Write the N fastest kernels."),
    home: Path | None = HOME,
    as_json: bool = JSON,
) -> None:
    with open_history(home) as snapshot:
        rebuilt = rebuild_campaign(snapshot, campaign)
    board = campaign_leaderboard(rebuilt.history, campaign)
    winners, baseline = board.rows[:top], board.baseline
    history = rebuilt.history
    if not winners:
        raise UserError(f"campaign {campaign!r} has no timed kernel yet")
    if top == 1 and output is None:
        if as_json:
            best = describe(winners[0], None, baseline)
            print(
                to_json(
                    {
                        **best,
                        "source": kernel_text(
                            winners[0].candidate, lineage_of(history, winners[0].candidate)
                        ),
                    }
                )
            )
        else:
            sys.stdout.write(
                kernel_text(winners[0].candidate, lineage_of(history, winners[0].candidate))
            )
        return
    written = []
    if top == 1:
        assert output is not None
        path = write_kernel(winners[0].candidate, output, lineage_of(history, winners[0].candidate))
        written.append(describe(winners[0], path, baseline))
    else:
        folder = output or Path(f"best-{campaign}")
        if folder.exists() and not folder.is_dir():
            raise UserError(f"--top {top} writes several files: -o must be a folder, not {folder}")
        for row in winners:
            path = write_kernel(
                row.candidate,
                folder / file_name(row.candidate, row.rank),
                lineage_of(history, row.candidate),
            )
            written.append(describe(row, path, baseline))
    if as_json:
        print(to_json(written if top > 1 else written[0]))
        return
    for item in written:
        speedup = item["speedup_vs_campaign_baseline"] or item["speedup"]
        print(
            f"{item['path']}: {item['candidate_id']}, {item['median_ns'] / 1e6:.4f} ms "
            f"(IQR {item['iqr_ns'] / 1e6:.4f}, {_runs(item['timing_runs'])}), {speedup:.3f}x"
        )
    if baseline is not None:
        print(f"campaign baseline: {baseline.words()}")


def _runs(count: int) -> str:
    return f"{count} timing run" + ("" if count == 1 else "s")


def register(app: typer.Typer) -> None:
    app.command("best", help=BEST_HELP)(best)
