"""The smaller items of issue 35 (item 6) in the views: the terminal leaderboard says how
many of its rows it shows and how to see more."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from actors.campaign.history import History
from eventstore.codec import decode
from ops.run_cmd import _print_results as print_results
from ops.run_cmd import _result as run_result

LOG = Path(__file__).parent / "recorded" / "softmax-two-generations.jsonl"
CAMPAIGN = "recorded-softmax"


def _history() -> History:
    history = History()
    lines = [line for line in LOG.read_bytes().splitlines() if line]
    for position, line in enumerate(lines, 1):
        history.apply(position, decode(line))
    return history


def test_the_leaderboard_says_how_many_rows_it_shows(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_result(_history(), CAMPAIGN, Console(file=io.StringIO()))
    rows = len(result["leaderboard"])
    assert rows == 6
    print_results(result, 3)
    out = capsys.readouterr().out
    assert "3 of 6 shown; `--top N` shows more" in out
    print_results(result, 10)
    assert "shown;" not in capsys.readouterr().out
