"""The `lineage` and `rejections` views over a real DuckDB store: each candidate with the
operator, parameters and parents it came from, its diff, status and own time; and each
rejection with the operator that proposed it, a refusal of the write stage included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.search.lineage import EVOLVE_TEMPLATE
from actors.search.strategy import Filled
from eventstore.codec import encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.events import CandidateProposed
from eventstore.store import Recorded
from tests.evolve_history import CAMPAIGN, Log


def _rows(store: DuckDBEventStore, sql: str) -> list[dict[str, Any]]:
    result = store.query(sql)
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def test_the_lineage_view_shows_how_each_kernel_came_from_its_parents(tmp_path: Path) -> None:
    log = Log(tmp_path, per_generation=2)
    seed = log.timed_seed(median_ns=40_000.0)
    filled = log.fill(1, count=2)
    assert isinstance(filled, Filled)
    planned = filled.candidates[0]
    (child,) = log.propose(1, [planned], opened=2)
    refused = log.add(
        CandidateProposed,
        template=EVOLVE_TEMPLATE,
        params={},
        param_key="refused",
        operator="approx_math",
        parents=[seed],
        **log.work(f"{CAMPAIGN}:g1:c1", 1),
    )
    for proposal in (child, refused):
        log.write(proposal)
    log.timed(child.candidate_id, 1, 20_000.0)

    store = DuckDBEventStore(tmp_path / "events.duckdb")
    try:
        store.append([Recorded(e, encode(e)) for e in log.events])
        lineage = {
            r["candidate_id"]: r
            for r in _rows(store, "SELECT * FROM lineage ORDER BY candidate_id")
        }
        rejections = _rows(store, "SELECT candidate_id, stage, reason, operator FROM rejections")
    finally:
        store.close()
    row = lineage[child.candidate_id]
    assert (row["operator"], list(row["parents"]), row["status"]) == (
        planned.operator,
        [seed],
        "benchmarked",
    )
    assert row["diff"].startswith("---") and row["writer"] == "operator"
    assert row["median_ns"] == 20_000.0 and row["speedup"] > 0
    assert lineage[seed]["parents"] == [] and lineage[seed]["diff"] == ""
    assert lineage[refused.candidate_id]["status"] == "rejected"
    assert rejections == [
        {
            "candidate_id": refused.candidate_id,
            "stage": "write",
            "reason": rejections[0]["reason"],
            "operator": "approx_math",
        }
    ]
