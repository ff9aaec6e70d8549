"""`kfactory best CAMPAIGN`: write the winning kernel (or the top N) as checkable files.

Its answer is final when the campaign's latest final run timed its current top N together
(`actors.campaign.final_answer`); otherwise it says on stderr (and in `--json`'s
`provisional`) that it is provisional, and how to make it final: `--final-run` has the
swarm time them now (`ops/final_answer.py`), then answers from the updated leaderboard.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from actors.campaign.final_answer import final_answer
from actors.campaign.history import History
from actors.campaign.leaderboard import campaign_leaderboard
from actors.records.best_kernels import describe, file_name, kernel_text, write_kernel
from actors.search.lineage import lineage_of
from ops.errors import UserError
from ops.final_answer import run_final
from ops.options import HOME, JSON
from ops.output import to_json
from ops.store_access import open_history, rebuild_campaign

BEST_HELP = """Write a campaign's best verified kernel: the winner of its final run (its top kernels, 4 by default, timed together in one interleaved run when its search ended), whose contenders follow in that run's order and the others by their pooled time. Its source goes after a `// kfactory-flags:` line and a provenance comment, so that `kfactory check` and a plain compiler take the file as it is.

A campaign with no final run of its current top kernels (stopped before its search ended, or kernels timed after its final run) gives a provisional answer, ranked by head-to-head runs and pooled time: `best` says so on stderr (and in --json's `provisional`; the exit status stays 0). --final-run makes it final: the swarm (the hub running for --home, else one started here) times the current top kernels together now, recorded as events like the end-of-search final run, then `best` answers from the updated leaderboard. A host that cannot time the campaign's target (cuda without a GPU) is refused, nothing recorded.

Without -o the source goes to standard output. With --top N the best and the next N-1 are written into the folder -o names (default ./best-CAMPAIGN), as 01-<candidate>.c, 02-.... The text output gives each kernel's time (the median over every run that timed it: its own, and each head-to-head run that timed it as the best; the IQR of its own run), the number of those runs, its speedup over the campaign's baseline (the median of its candidates' baseline medians), how its rank was decided, and that baseline with its spread.

Examples:

  kfactory best demo-softmax -o softmax.c && kfactory check softmax --source softmax.c

  kfactory best demo-softmax --top 3 -o winners/

  kfactory best demo-softmax -o softmax.c --json

  kfactory best demo-softmax --final-run -o softmax.c   (a campaign stopped before its search ended)
"""  # noqa: E501


def best(
    campaign: str = typer.Argument(..., help="The campaign id (its name)."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="File to write (a folder with --top)."
    ),
    top: int = typer.Option(1, "--top", min=1, help="Write the N fastest kernels."),
    final_run: bool = typer.Option(
        False,
        "--final-run",
        help="First have the swarm time the campaign's current top kernels together, unless "
        "its final run did.",
    ),
    home: Path | None = HOME,
    as_json: bool = JSON,
) -> None:
    history = _history(home, campaign)
    if final_run and final_answer(history, campaign).final:
        print(f"campaign {campaign}: its answer is final already; nothing to time", file=sys.stderr)
    elif final_run:
        run_final(home, campaign, history.campaigns[campaign].spec)
        history = _history(home, campaign)
    provisional = final_answer(history, campaign).provisional()
    if provisional is not None and not as_json:
        print(provisional, file=sys.stderr)
    board = campaign_leaderboard(history, campaign)
    winners, baseline = board.rows[:top], board.baseline
    if not winners:
        raise UserError(f"campaign {campaign!r} has no timed kernel yet")
    if top == 1 and output is None:
        if as_json:
            best = describe(winners[0], None, baseline)
            print(
                to_json(
                    {
                        **best,
                        "provisional": provisional,
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
        written.append({**describe(winners[0], path, baseline), "provisional": provisional})
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
            written.append({**describe(row, path, baseline), "provisional": provisional})
    if as_json:
        print(to_json(written if top > 1 else written[0]))
        return
    for item in written:
        speedup = item["speedup_vs_campaign_baseline"] or item["speedup"]
        print(
            f"{item['path']}: {item['candidate_id']}, {item['median_ns'] / 1e6:.4f} ms "
            f"(IQR {item['iqr_ns'] / 1e6:.4f}, {_runs(item['timing_runs'])}), {speedup:.3f}x; "
            f"{_decided(item)}"
        )
    if baseline is not None:
        print(f"campaign baseline: {baseline.words()}")


def _history(home: Path | None, campaign: str) -> History:
    with open_history(home) as snapshot:
        return rebuild_campaign(snapshot, campaign).history


def _decided(item: dict[str, Any]) -> str:
    """How its rank was decided, with its figure in the final run that placed it."""
    final = item["final_run"]
    if final is None:
        return f"decided by {item['decided_by']}"
    return (
        f"decided by {item['decided_by']}: {final['mean_ns'] / 1e6:.4f} ms mean "
        f"(IQR {final['iqr_ns'] / 1e6:.4f})"
    )


def _runs(count: int) -> str:
    return f"{count} timing run" + ("" if count == 1 else "s")


def register(app: typer.Typer) -> None:
    app.command("best", help=BEST_HELP)(best)
