"""A real evolve campaign end to end: `kfactory run --writer evolve` (its own nats-server,
recorder, DuckDB store and actors) on a small user problem with a plain scalar seed and a
budget of four. It finishes; the children the operators wrote are verified and timed,
their KernelWritten records the operator, the parents and the diff, the lineage view
shows them; and the strategy replayed over the recorded history proposes exactly what the
swarm proposed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from actors.campaign.history import History
from actors.campaign.summary import spent_candidates
from actors.search.evolve_strategy import EvolveStrategy
from actors.search.lineage import EVOLVE_TEMPLATE
from actors.search.strategy import Filled, GenerationInputs
from eventstore.codec import decode
from eventstore.events import CandidateProposed, GenerationOpened
from tests.decision_log import record
from tests.evolve_history import write_problem
from tests.session_share import locked, shared_dir
from tests.test_swarm import sql

NAME = "evolve-e2e"
pytestmark = pytest.mark.xdist_group("evolve-campaign")  # its tests read one store


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Run once per session: a module fixture is set up again whenever its worker runs
    another module's test between this module's."""
    folder = shared_dir(tmp_path_factory, "evolve-campaign")
    home, result_file = folder / "home", folder / "run.json"
    with locked(folder):
        if not result_file.exists():
            problem, seed = write_problem(folder)
            done = subprocess.run(
                [
                    sys.executable, "-m", "ops.cli", "run", "--problem", problem,
                    "--seed-source", str(seed), "--writer", "evolve", "--budget", "4",
                    "--per-generation", "3", "--shapes", "64x512", "--wall-time", "5m",
                    "--name", NAME, "--json", "--home", str(home),
                ],
                capture_output=True,
                text=True,
                timeout=400,
                env={"PATH": "/usr/bin:/bin"},
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            result_file.write_text(done.stdout)
    return home, json.loads(result_file.read_text())


def test_operators_write_verified_children_that_record_their_lineage(
    campaign: tuple[Path, dict[str, Any]],
) -> None:
    home, result = campaign
    assert result["finished"].startswith("budget reached")
    written = sql(
        home,
        "SELECT w.payload->>'candidate_id' AS candidate, w.payload->>'operator' AS operator, "
        "w.payload->'parents' AS parents, w.payload->>'diff' AS diff FROM events w "
        "JOIN events v ON v.payload->>'candidate_id' = w.payload->>'candidate_id' "
        "WHERE w.type = 'KernelWritten' AND v.type = 'KernelVerified' "
        "AND w.payload->>'writer' = 'operator'",
    )
    assert written, "no child an operator wrote was verified"
    for row in written:
        assert row["operator"] and str(row["diff"]).startswith("---")
        assert json.loads(str(row["parents"])) == [f"{NAME}:g0:c0"]
    lineage = {
        str(r["candidate_id"]): r
        for r in sql(home, f"SELECT * FROM lineage WHERE campaign_id = '{NAME}'")
    }
    for row in written:
        shown = lineage[str(row["candidate"])]
        assert shown["operator"] == row["operator"] and shown["diff"] == row["diff"]
    assert any(r["median_ns"] for r in lineage.values() if r["writer"] == "operator")


def test_the_strategy_replayed_proposes_what_the_swarm_proposed(
    campaign: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    home, _ = campaign
    record(home, NAME, tmp_path / "log.jsonl")
    log = [decode(line.encode()) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    history = History()
    checked = 0
    for position, event in enumerate(log, 1):
        if isinstance(event, GenerationOpened) and event.generation > 0:
            campaign_state = history.campaigns[NAME]
            spec = campaign_state.spec
            count = min(
                spec.search.per_generation,
                spec.budget.candidates - spent_candidates(history, campaign_state),
            )
            inputs = GenerationInputs(count, [], [], frozenset(), [])
            filled = EvolveStrategy().fill(history, campaign_state, event.generation, inputs)
            proposed = [
                e
                for e in log
                if isinstance(e, CandidateProposed) and e.generation == event.generation
            ]
            assert isinstance(filled, Filled)
            assert [p.param_key for p in filled.candidates] == [p.param_key for p in proposed]
            assert all(p.template == EVOLVE_TEMPLATE for p in proposed)
            checked += 1
        history.apply(position, event)
    assert checked >= 1


def test_the_report_and_the_best_file_show_the_lineage(
    campaign: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    home, _ = campaign
    page, best = tmp_path / "report.html", tmp_path / "best.c"
    for args in (("report", NAME, "-o", str(page)), ("best", NAME, "-o", str(best))):
        done = subprocess.run(
            [sys.executable, "-m", "ops.cli", *args, "--home", str(home)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    operators = {
        str(r["operator"])
        for r in sql(
            home,
            f"SELECT operator FROM lineage WHERE campaign_id = '{NAME}' AND writer = 'operator'",
        )
    }
    section = page.read_text().split("<h2>Lineage</h2>")[1].split("<h2>")[0]
    assert operators and all(f"<td>{op}</td>" in section for op in operators)
    text = best.read_text()
    assert text.startswith("// kfactory-flags:")
    if "template evolve" in text.splitlines()[1]:  # the winner is an operator's child
        assert "// lineage: 1 operator step(s)" in text
