"""The leaderboard read model over logs recorded in the format before typed timing facts
(BenchmarkCompleted schema 1, every fact in `evidence`): it ranks them as the code of
that time did, the SQL view gives the same figures whether a store holds old or new
payloads, and the audit of such a store agrees."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from actors.campaign.history import History
from actors.campaign.leaderboard import Leaderboard, campaign_leaderboard
from actors.records.audit import audit_projections
from eventstore.codec import SCHEMA_1_TIMING_FACTS, decode, encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.events import (
    SYSTEM_CAMPAIGN,
    ActorRef,
    BenchmarkCompleted,
    HostCalibrated,
    new_event,
)
from eventstore.store import Recorded
from ops.audit_cmd import audit_claims
from ops.store_access import open_home

ROOT = Path(__file__).parent
LOGS = {
    "recorded-softmax": ROOT / "recorded" / "softmax-two-generations.jsonl",
    "recorded": ROOT / "logs" / "softmax-two-generations.jsonl",
}

# What the code before typed timing facts printed for these logs (`kfactory run --json`'s
# leaderboard): the best first, then by own time; own median, timing runs, standing.
BEFORE = {
    "recorded-softmax": (
        1638998.5,
        [
            ("g1:c2", 760596.0, 1, "promoted: beat g1:c1 head to head"),
            ("g0:c1", 1542918.0, 1, "lost to g0:c0 head to head"),
            ("g1:c1", 1565563.25, 2, "promoted: beat g0:c0 head to head"),
            ("g0:c0", 1571687.0, 5, "promoted: timed first"),
            ("g0:c2", 2225843.5, 1, "lost to g0:c0 head to head"),
            ("g1:c0", 3664146.0, 1, "lost to g0:c0 head to head"),
        ],
    ),
    "recorded": (
        5642229.75,
        [
            ("g1:c3", 1053836.0, 1, "promoted: beat g0:c3 head to head"),
            ("g0:c3", 993398.0, 5, "promoted: beat g0:c0 head to head"),
            ("g0:c0", 1176105.5, 4, "promoted: timed first"),
            ("g1:c0", 1429224.5, 1, "lost to g0:c3 head to head"),
            ("g1:c2", 1499847.5, 1, "lost to g0:c3 head to head"),
            ("g1:c1", 3669696.0, 1, "lost to g0:c3 head to head"),
            ("g0:c2", 4045270.0, 1, "lost to g0:c0 head to head"),
            ("g0:c1", 4544927.0, 1, "lost to g0:c0 head to head"),
        ],
    ),
}


def recorded_lines(campaign: str) -> list[bytes]:
    return [line for line in LOGS[campaign].read_bytes().splitlines() if line]


def board_of(lines: list[bytes], campaign: str) -> Leaderboard:
    history = History()
    for position, line in enumerate(lines, 1):
        history.apply(position, decode(line))
    return campaign_leaderboard(history, campaign)


def store_of(home: Path, payloads: list[bytes]) -> Path:
    """A store holding exactly these payloads, in this order."""
    home.mkdir()
    store = DuckDBEventStore(home / "events.duckdb")
    store.append([Recorded(decode(payload), payload) for payload in payloads])
    store.close()  # the store creates the views
    return home


@pytest.mark.parametrize("campaign", sorted(LOGS))
def test_the_logs_are_of_the_format_before_typed_timing_facts(campaign: str) -> None:
    timings = [
        msgspec.json.decode(line)
        for line in recorded_lines(campaign)
        if b'"type":"BenchmarkCompleted"' in line
    ]
    assert len(timings) == len(BEFORE[campaign][1])
    for raw in timings:
        assert raw["schema"] == 1 and set(SCHEMA_1_TIMING_FACTS) <= set(raw["evidence"])
        assert not set(SCHEMA_1_TIMING_FACTS.values()) & set(raw) - {"shape"}
    assert sum(raw["evidence"]["head_to_head"] is not None for raw in timings) >= 3


@pytest.mark.parametrize("campaign", sorted(LOGS))
def test_a_log_of_the_old_format_ranks_as_it_did(campaign: str) -> None:
    board = board_of(recorded_lines(campaign), campaign)
    baseline, rows = BEFORE[campaign]
    assert board.baseline is not None and board.baseline.median_ns == baseline
    got = [(":".join(r.candidate_id.split(":")[-2:]), r.runs, r.standing) for r in board.rows]
    assert got == [(name, runs, standing) for name, _, runs, standing in rows]
    pooled = [r.pooled_median_ns for r in board.rows]
    assert pooled == pytest.approx([row[1] for row in rows], rel=1e-12)
    assert board.best is board.rows[0] and board.best.standing.startswith("promoted")
    assert [r.rank for r in board.rows] == list(range(1, len(rows) + 1))
    for row in board.rows:
        assert row.speedup_vs_campaign_baseline == pytest.approx(
            baseline / row.pooled_median_ns, rel=1e-12
        )
        assert (row.median_ns, row.speedup) == (row.timed.median_ns, row.timed.speedup)
        assert row.shape == {"rows": 256, "cols": 1024} and row.q1_ns is not None


@pytest.mark.parametrize("campaign", sorted(LOGS))
@pytest.mark.parametrize("payloads", ["as recorded", "re-encoded", "mixed"])
def test_the_sql_leaderboard_gives_the_python_leaderboard_s_figures(
    tmp_path: Path, campaign: str, payloads: str
) -> None:
    """Over a store of old payloads, of the same events in today's format, and of both
    (a campaign recorded before the change and resumed after it): the view's rows, by
    rank, are the Python leaderboard's kernels by own time, with its figures."""
    lines = recorded_lines(campaign)
    if payloads != "as recorded":
        half = len(lines) // 2 if payloads == "mixed" else 0
        lines = lines[:half] + [encode(decode(line)) for line in lines[half:]]
        assert b'"schema":2' in b"".join(lines)
    home = store_of(tmp_path / "home", lines)
    with open_home(home) as snapshot:
        viewed = snapshot.conn.execute(
            "SELECT candidate_id, rank, pooled_median_ns, runs, speedup_vs_campaign_baseline, "
            "campaign_baseline_ns, shape, median_ns, iqr_ns, speedup "
            "FROM leaderboard WHERE campaign_id = ? ORDER BY rank, candidate_id",
            [campaign],
        ).fetchall()
    board = board_of(lines, campaign)
    assert board.baseline is not None
    by_own_time = sorted(board.rows, key=lambda r: r.pooled_median_ns)
    assert [v[0] for v in viewed] == [r.candidate_id for r in by_own_time]
    for v, row in zip(viewed, by_own_time, strict=True):
        assert v[2] == pytest.approx(row.pooled_median_ns, rel=1e-12) and v[3] == row.runs
        assert v[4] == pytest.approx(row.speedup_vs_campaign_baseline, rel=1e-12)
        assert v[5] == pytest.approx(board.baseline.median_ns, rel=1e-12)
        assert msgspec.json.decode(v[6]) == row.shape
        assert v[7:] == pytest.approx((row.median_ns, row.iqr_ns, row.speedup), rel=1e-12)


@pytest.mark.parametrize("campaign", sorted(LOGS))
def test_the_audit_of_a_store_of_old_payloads_agrees(tmp_path: Path, campaign: str) -> None:
    timed = recorded_lines(campaign)
    lines = [*calibrations_of(timed), *timed]  # the kf-system events the campaign's log lacks
    home = store_of(tmp_path / "home", lines)
    with open_home(home) as snapshot:
        claims = audit_claims(snapshot, campaign, None)
    assert [c for c in claims if c.status == "differs"] == []
    board = [c for c in claims if c.name == "leaderboard"]
    assert [c.status for c in board] == ["agrees"], board
    best = board_of(lines, campaign).best
    assert best is not None and best.candidate_id in board[0].evidence
    assert audit_projections(enumerate(map(decode, lines), 1), campaign) == [
        c for c in claims if c.area not in ("chain", "columns", "causality")
    ]


def calibrations_of(lines: list[bytes]) -> list[bytes]:
    """The HostCalibrated each device a log's benchmarks name was recorded with first."""
    devices = sorted({e.device for e in map(decode, lines) if isinstance(e, BenchmarkCompleted)})
    actor = ActorRef(role="benchmarker", instance="benchmarker-1", host="recording-host")
    return [
        encode(
            new_event(
                HostCalibrated,
                campaign_id=SYSTEM_CAMPAIGN,
                actor=actor,
                device=device,
                bandwidth_gbs=10.0,
                peak_gflops=100.0,
            )
        )
        for device in devices
    ]


def test_an_old_benchmark_decodes_into_typed_fields_and_keeps_the_rest_as_evidence() -> None:
    line = next(
        line
        for line in recorded_lines("recorded-softmax")
        if b'"type":"BenchmarkCompleted"' in line and b'"head_to_head":{' in line
    )
    old = msgspec.json.decode(line)["evidence"]
    timed = decode(line)
    assert isinstance(timed, BenchmarkCompleted) and timed.schema == BenchmarkCompleted.SCHEMA == 2
    for name, field in SCHEMA_1_TIMING_FACTS.items():
        assert msgspec.to_builtins(getattr(timed, field)) == old[name], name
    assert timed.head_to_head is not None and timed.head_to_head.wins is None
    assert timed.evidence == {k: v for k, v in old.items() if k not in SCHEMA_1_TIMING_FACTS}
    assert set(timed.evidence) == {
        "judged_calls",
        "rechecked",
        "handshake_ns",
        "lease",
        "contained_by",
    }
    assert decode(encode(timed)) == timed  # today's format reads back the same


def test_a_forged_fact_in_an_old_event_stays_in_evidence() -> None:
    line = next(line for line in recorded_lines("recorded-softmax") if b'"incumbent":"' in line)
    raw = msgspec.json.decode(line)
    raw["evidence"] |= {"incumbent": ["c0"], "speedup_vs_incumbent": "fast", "shape": None}
    timed = decode(msgspec.json.encode(raw))
    assert isinstance(timed, BenchmarkCompleted)
    assert (timed.incumbent, timed.speedup_vs_incumbent, timed.shape) == (None, None, {})
    assert (
        timed.evidence["incumbent"] == ["c0"] and timed.evidence["speedup_vs_incumbent"] == "fast"
    )
    assert "shape" not in timed.evidence and timed.head_to_head is not None
