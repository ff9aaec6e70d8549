"""A one-minute soak (bench/soak.py): kills of actors and a NATS node under a running
campaign lose no event, evaluate nothing twice, and are all recovered from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # a minute of soak, then the campaign under way finishes
@pytest.mark.timeout(900)
def test_a_one_minute_soak_loses_nothing_and_recovers_from_every_kill(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "soak.py"), "--minutes", "1",
         "--actor-kill-every", "20", "--node-kill-every", "40", "--out", str(out),
         "--keep", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=850,
        cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["candidates_settled"] > 0, figures
    assert figures["events_published"] > 0 and figures["events_lost"] == 0, figures
    assert figures["stored_twice"] == 0 and figures["duplicate_evaluations"] == 0, figures
    kinds = [r["what"].split()[0] for r in figures["recoveries"]]
    assert "actor" in kinds and "nats" in kinds, figures["recoveries"]
    assert figures["unrecovered"] == 0, figures["recoveries"]
    assert figures["campaigns_finished"] == figures["campaigns"], figures
