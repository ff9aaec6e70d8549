"""A truer best, from recorded events alone (no timing here): kernels ranked by their own
time at the campaign's shape, one campaign-level baseline, promotion by head-to-head."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import msgspec
from rich.console import Console

from actors.campaign.campaign_file import Budget, CampaignSpec
from actors.campaign.history import History
from actors.campaign.leaderboard import campaign_leaderboard
from actors.campaign.ranking import (
    RunningBoard,
    best_of,
    campaign_baseline,
    own_times,
    promotions,
    speedup_over,
    standings,
)
from actors.records.audit import audit_projections
from actors.records.story import generations as story_generations
from actors.roles.librarian import decide_librarian
from actors.runtime import Reactions
from actors.search.lessons import RULE
from eventstore.codec import decode, encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.events import (
    ActorRef,
    BenchmarkCompleted,
    CampaignStarted,
    CandidateProposed,
    Event,
    GenerationClosed,
    GenerationOpened,
    HeadToHeadRecord,
    KernelVerified,
    KernelWritten,
    LessonLearned,
    new_event,
)
from eventstore.store import Recorded
from gpu_workers.benchmarking import (
    PROMOTION_ALPHA,
    head_to_head,
    in_doubt,
    paired_rounds,
    wins_by_chance,
    within_noise,
)
from gpu_workers.protocols import TimingRun
from gpu_workers.results import HeadToHead
from ops.progress import Progress
from ops.run_cmd import _generations as run_generations
from ops.run_cmd import _print_results as print_results
from ops.run_cmd import _result as run_result
from tests.old_format import in_schema_one

CAMPAIGN = "ranked"
ACTOR = ActorRef(role="benchmarker", instance="benchmarker-0", host="test")
LIBRARIAN = ActorRef(role="librarian", instance="librarian-0", host="test")
SHAPE = {"rows": 4096, "cols": 4096}
START = datetime(2026, 1, 1, tzinfo=UTC)


class Recorder:
    """A campaign's events, applied to a History as the actors would see them."""

    def __init__(self, planned: int = 8) -> None:
        self.history = History()
        self.events: list[Event] = []
        spec = CampaignSpec(problem="softmax", target="cpu", budget=Budget(candidates=8))
        self.started = self.emit(
            new_event(
                CampaignStarted,
                campaign_id=CAMPAIGN,
                actor=ACTOR,
                name=CAMPAIGN,
                problem="softmax",
                target="cpu",
                config=spec.to_config(),
            )
        )
        self.opened = self.emit(
            new_event(
                GenerationOpened,
                campaign_id=CAMPAIGN,
                actor=ACTOR,
                cause=self.started,
                generation=0,
                planned=planned,
            )
        )

    def emit(self, event: Event) -> Event:
        # Distinct, increasing timestamps: the order the benchmarker recorded them in.
        event = type(event)(**{**_fields(event), "ts": START + timedelta(seconds=len(self.events))})
        self.history.apply(len(self.events) + 1, event)
        self.events.append(event)
        return event

    def timed(
        self,
        name: str,
        median_ms: float,
        baseline_ms: float,
        *,
        iqr_ms: float = 0.1,
        versus: str | None = None,
        faster: bool | None = None,
        ratio: float | None = None,
        incumbent_ms: float | None = None,
        shape: dict[str, int] = SHAPE,
        mean_ms: float | None = None,
        baseline_mean_ms: float | None = None,
    ) -> str:
        """A candidate that was written, verified and timed with these figures: recorded
        under the mean rule when `mean_ms` is given, else as before the mean was kept."""
        candidate_id = f"{CAMPAIGN}:g0:{name}"
        work = {"problem": "softmax", "target": "cpu", "candidate_id": candidate_id}
        proposed = self.emit(
            new_event(
                CandidateProposed,
                campaign_id=CAMPAIGN,
                actor=ACTOR,
                cause=self.opened,
                generation=0,
                template="softmax_rows",
                params={"threads": len(self.events)},
                **work,
            )
        )
        digest = f"{len(self.events):064x}"
        written = self.emit(
            new_event(
                KernelWritten,
                campaign_id=CAMPAIGN,
                actor=ACTOR,
                cause=proposed,
                generation=0,
                source_hash=digest,
                source=f"/* {name} */",
                flags=["-O3"],
                writer="template",
                **work,
            )
        )
        verified = self.emit(
            new_event(
                KernelVerified,
                campaign_id=CAMPAIGN,
                actor=ACTOR,
                cause=written,
                generation=0,
                source_hash=digest,
                max_rel_err=1e-7,
                trials=72,
                **work,
            )
        )
        versus_fields: dict[str, Any] = {}
        if versus is not None:
            median_ratio = ratio if ratio is not None else 0.97 if faster else 1.03
            versus_fields["incumbent"] = f"{CAMPAIGN}:g0:{versus}"
            versus_fields["head_to_head"] = HeadToHeadRecord(
                ratio_median=median_ratio,
                ratio_q1=median_ratio,
                ratio_q3=median_ratio,
                rounds=30,
                remeasured=False,
                faster=bool(faster),
            )
        time_ms = median_ms if mean_ms is None else mean_ms
        if incumbent_ms is not None:  # the incumbent's time in this run, as recorded
            versus_fields["speedup_vs_incumbent"] = incumbent_ms / time_ms
        if mean_ms is not None:
            versus_fields["mean_ns"] = mean_ms * 1e6
            versus_fields["baseline_mean_ns"] = (baseline_mean_ms or baseline_ms) * 1e6
        baseline_time_ms = baseline_ms if mean_ms is None else baseline_mean_ms or baseline_ms
        self.emit(
            new_event(
                BenchmarkCompleted,
                campaign_id=CAMPAIGN,
                actor=ACTOR,
                cause=verified,
                generation=0,
                source_hash=digest,
                median_ns=median_ms * 1e6,
                iqr_ns=iqr_ms * 1e6,
                baseline="numpy float32",
                baseline_ns=baseline_ms * 1e6,
                speedup=baseline_time_ms / time_ms,
                roofline_fraction=0.5,
                shape=shape,
                **versus_fields,
                **work,
            )
        )
        return candidate_id


def _fields(event: Event) -> dict[str, Any]:
    return {f: getattr(event, f) for f in event.__struct_fields__}


def ids(candidates: list[Any]) -> list[str]:
    return [c.candidate_id.rsplit(":", 1)[-1] for c in candidates]


def noisy_baselines(planned: int = 8) -> Recorder:
    """c2 has the highest recorded speedup only because its own baseline ran slow; c1 is
    the fastest kernel and beat the incumbent head to head."""
    log = Recorder(planned)
    log.timed("c0", median_ms=10.0, baseline_ms=100.0)  # 10x
    log.timed("c1", median_ms=8.0, baseline_ms=60.0, versus="c0", faster=True)  # 7.5x
    log.timed("c2", median_ms=9.0, baseline_ms=120.0, versus="c1", faster=False)  # 13.3x
    return log


def test_the_fastest_own_time_wins_where_the_speedup_ranking_would_not() -> None:
    log = noisy_baselines()
    candidates = log.history.campaign_candidates(CAMPAIGN)
    by_recorded_speedup = max(candidates, key=lambda c: c.speedup or 0.0)
    assert ids([by_recorded_speedup]) == ["c2"]  # what the old ranking picked
    assert ids([log.history.best(CAMPAIGN)]) == ["c1"]
    assert ids(campaign_leaderboard(log.history, CAMPAIGN).rows) == ["c1", "c2", "c0"]
    baseline = campaign_baseline(candidates)
    assert baseline is not None and baseline.median_ns == 100e6 and baseline.candidates == 3
    assert (baseline.q1_ns, baseline.q3_ns) == (80e6, 110e6)
    times = own_times(candidates)
    order = campaign_leaderboard(log.history, CAMPAIGN).rows
    speedups = [speedup_over(times[c.candidate_id], baseline) for c in order]
    assert speedups == [100 / 8, 100 / 9, 100 / 10]  # one baseline: the order of own times


def test_each_row_says_why_it_is_or_is_not_the_best() -> None:
    log = noisy_baselines()
    # c3 is faster by its own median than the best, c1, but lost to it head to head;
    # c4 was timed against no kernel and is within c1's noise; c6 had a median ratio below
    # 1 against c5, the best by then, by too few round wins to tell from chance.
    log.timed("c3", median_ms=7.9, baseline_ms=100.0, versus="c1", faster=False)
    log.timed("c4", median_ms=8.05, baseline_ms=100.0, iqr_ms=0.2)
    log.timed("c5", median_ms=6.0, baseline_ms=100.0)
    log.timed("c6", median_ms=5.9, baseline_ms=100.0, versus="c5", faster=False, ratio=0.99)
    words = {
        k.rsplit(":", 1)[-1]: v
        for k, v in standings(log.history.campaign_candidates(CAMPAIGN)).items()
    }
    assert words == {
        "c0": "promoted: timed first",
        "c1": "promoted: beat g0:c0 head to head",
        "c2": "lost to g0:c1 head to head",
        "c3": "lost to g0:c1 head to head",
        "c4": "not clearly faster than g0:c1 by own time",
        "c5": "promoted: faster than g0:c1 by own time",
        "c6": "not clearly faster than g0:c5 head to head",
    }
    assert ids(campaign_leaderboard(log.history, CAMPAIGN).rows)[:4] == ["c5", "c6", "c3", "c1"]


def test_the_librarian_the_audit_the_lessons_and_the_report_name_the_same_best() -> None:
    log = noisy_baselines(planned=3)  # the generation is settled: the librarian closes it
    history = log.history
    last = log.events[-1]
    out = Reactions(last, LIBRARIAN)
    decide_librarian(history, last, out)
    lessons = [e for e in out.events if isinstance(e, LessonLearned)]
    (closed,) = [e for e in out.events if isinstance(e, GenerationClosed)]
    assert closed.best_candidate == f"{CAMPAIGN}:g0:c1"  # not c2, the highest speedup
    (chain,) = [x for x in lessons if x.kind == "lineage"]
    assert chain.data == {
        "rule": RULE,
        "chain": [f"{CAMPAIGN}:g0:c0", f"{CAMPAIGN}:g0:c1"],
        "promotions": 2,
        "best": closed.best_candidate,
    }
    positioned = list(enumerate([*log.events, *out.events], 1))
    claims = audit_projections(positioned, CAMPAIGN)
    assert [c.status for c in claims if c.name == "leaderboard"] == ["agrees"]
    (row,) = story_generations(history, CAMPAIGN)
    assert row["best_in_generation"]["candidate_id"] == closed.best_candidate
    assert row["best_so_far"]["candidate_id"] == closed.best_candidate
    (reported,) = run_generations(history, CAMPAIGN, campaign_leaderboard(history, CAMPAIGN))
    assert reported["best_speedup"] == 60 / 8  # c1's figure: over the baseline in its run
    # A close that names the highest speedup instead is a difference the audit reports.
    forged = msgspec.structs.replace(closed, best_candidate=f"{CAMPAIGN}:g0:c2")
    swapped = [e if e is not closed else forged for e in out.events]
    claims = audit_projections(list(enumerate([*log.events, *swapped], 1)), CAMPAIGN)
    assert [c.status for c in claims if c.name == "leaderboard"] == ["differs"]


def test_a_faster_looking_kernel_that_lost_head_to_head_is_not_promoted() -> None:
    log = noisy_baselines()
    log.timed("c3", median_ms=7.9, baseline_ms=100.0, versus="c1", faster=False)
    assert ids([log.history.best(CAMPAIGN)]) == ["c1"]
    assert ids(campaign_leaderboard(log.history, CAMPAIGN).rows) == ["c1", "c3", "c2", "c0"]


def test_without_a_head_to_head_only_a_clear_margin_promotes() -> None:
    log = noisy_baselines()
    log.timed("c3", median_ms=7.95, baseline_ms=100.0, iqr_ms=0.2, versus="c0", faster=True)
    assert ids([log.history.best(CAMPAIGN)]) == ["c1"]  # timed against an older best: noise
    log.timed("c4", median_ms=6.0, baseline_ms=100.0, versus="c0", faster=True)
    assert ids([log.history.best(CAMPAIGN)]) == ["c4"]  # far beyond both IQRs


def test_kernels_timed_at_another_shape_do_not_compete() -> None:
    log = noisy_baselines()
    log.timed("small", median_ms=0.5, baseline_ms=4.0, shape={"rows": 64, "cols": 64})
    assert ids(campaign_leaderboard(log.history, CAMPAIGN).rows) == ["c1", "c2", "c0"]
    assert ids([best_of(log.history.campaign_candidates(CAMPAIGN))]) == ["c1"]


def test_the_leaderboard_view_ranks_by_own_time_over_one_baseline(tmp_path: Path) -> None:
    log = noisy_baselines()
    store = DuckDBEventStore(tmp_path / "events.duckdb")
    store.append([Recorded(e, encode(e)) for e in log.events])
    store.close()  # the store creates the views
    conn = duckdb.connect(str(tmp_path / "events.duckdb"), read_only=True)
    try:
        rows = conn.execute(
            "SELECT rank, candidate_id, speedup_vs_campaign_baseline, speedup, "
            "campaign_baseline_ns FROM leaderboard ORDER BY rank"
        ).fetchall()
    finally:
        conn.close()
    assert [(r[0], r[1].rsplit(":", 1)[-1]) for r in rows] == [(1, "c1"), (2, "c2"), (3, "c0")]
    assert [round(r[2], 6) for r in rows] == [round(100 / 8, 6), round(100 / 9, 6), 10.0]
    assert rows[1][3] == 120 / 9 and {r[4] for r in rows} == {100e6}


def viewed(log: Recorder, path: Path) -> list[tuple[str, float, int, float]]:
    """The SQL leaderboard of the log's campaign: (name, own median, runs, speedup) by rank."""
    store = DuckDBEventStore(path)
    store.append([Recorded(e, encode(e)) for e in log.events])
    store.close()
    conn = duckdb.connect(str(path), read_only=True)
    try:
        rows = conn.execute(
            "SELECT candidate_id, pooled_median_ns, runs, speedup_vs_campaign_baseline "
            "FROM leaderboard ORDER BY rank"
        ).fetchall()
    finally:
        conn.close()
    return [(r[0].rsplit(":", 1)[-1], r[1], r[2], r[3]) for r in rows]


def by_own_time(log: Recorder) -> list[tuple[str, float, int, float | None]]:
    rows = campaign_leaderboard(log.history, CAMPAIGN).rows
    return [
        (
            r.candidate_id.rsplit(":", 1)[-1],
            r.pooled_median_ns,
            r.runs,
            r.speedup_vs_campaign_baseline,
        )
        for r in sorted(rows, key=lambda r: r.pooled_median_ns)
    ]


def test_the_view_and_the_leaderboard_take_the_shape_most_kernels_were_timed_at(
    tmp_path: Path,
) -> None:
    """Kernels timed at another shape are left out of both (the view once ranked them in a
    board of their own); with as many at each shape, the shape of the first listed wins."""
    small = {"rows": 64, "cols": 64}
    log = noisy_baselines()
    log.timed("s0", median_ms=0.5, baseline_ms=4.0, shape=small)
    log.timed("s1", median_ms=0.4, baseline_ms=4.0, shape=small)
    assert [name for name, *_ in by_own_time(log)] == ["c1", "c2", "c0"]
    assert viewed(log, tmp_path / "most.duckdb") == by_own_time(log)
    tie = Recorder()
    tie.timed("s0", median_ms=0.5, baseline_ms=4.0, shape=small)
    tie.timed("c0", median_ms=10.0, baseline_ms=100.0)
    tie.timed("c1", median_ms=8.0, baseline_ms=100.0)
    tie.timed("s1", median_ms=0.4, baseline_ms=4.0, shape=small)
    assert [name for name, *_ in by_own_time(tie)] == ["s1", "s0"]
    assert viewed(tie, tmp_path / "tie.duckdb") == by_own_time(tie)


def test_head_to_head_pairs_rounds_and_calls_a_straddle_noise() -> None:
    clear = TimingRun(kernel_ns=[90, 91, 92, 89, 90, 91], incumbent_ns=[100] * 6)
    versus = head_to_head(paired_rounds([clear]), remeasured=False)
    assert versus.faster and not within_noise(versus) and not in_doubt(versus)
    assert (versus.rounds, versus.wins) == (6, 6)
    close = TimingRun(kernel_ns=[95, 104, 97, 102], incumbent_ns=[100, 100, 100, 100])
    versus = head_to_head(paired_rounds([close]), remeasured=False)
    assert versus.ratio_median < 1 and within_noise(versus)  # looks faster, not in most rounds
    assert not versus.faster and in_doubt(versus)


def test_a_kernel_is_faster_only_with_more_round_wins_than_chance_gives() -> None:
    """Of two kernels of equal speed, the challenger wins each round as a coin would: a
    median ratio below 1 over 60 rounds (31 wins) is no promotion; 37 wins of 60 is (a
    one-sided sign test: 4.6% by chance), and 36 of 60 is not (7.7%)."""

    def over(wins: int, rounds: int) -> HeadToHead:
        pairs = [(97, 100)] * wins + [(102, 100)] * (rounds - wins)
        return head_to_head(pairs, remeasured=True)

    assert [over(w, 60).faster for w in (31, 36, 37, 60)] == [False, False, True, True]
    assert over(31, 60).ratio_median < 1.0 and over(31, 60).wins == 31
    assert wins_by_chance(37, 60) < PROMOTION_ALPHA < wins_by_chance(36, 60)
    assert wins_by_chance(0, 60) == 1.0 and wins_by_chance(60, 60) == 2.0**-60
    # three rounds all won is still chance (1 in 8): in doubt, so both are timed again
    few = head_to_head([(80, 100)] * 3, remeasured=False)
    assert not few.faster and not within_noise(few) and in_doubt(few)
    # a loser is never in doubt
    assert not in_doubt(over(10, 60))


def test_runs_leaderboard_shows_each_rows_standing(capsys: Any) -> None:
    log = noisy_baselines()
    result = run_result(log.history, CAMPAIGN, Console(file=io.StringIO()))
    rows = {row["candidate"].rsplit(":", 1)[-1]: row for row in result["leaderboard"]}
    assert [row["rank"] for row in result["leaderboard"]] == [1, 2, 3]
    assert rows["c1"]["rank"] == 1 and rows["c1"]["standing"].startswith("promoted: beat")
    assert rows["c2"]["standing"] == "lost to g0:c1 head to head"
    print_results(result)
    out = capsys.readouterr().out
    assert "standing" in out and "lost to g0:c1" in out and "Rank 1 is the best" in out


def test_progress_shows_the_best_by_its_figure() -> None:
    log = noisy_baselines()
    counts = Progress(log.history, CAMPAIGN).counts()
    # c1 is the best: 8 ms, over the 60 ms baseline timed in its own run (one figure
    # everywhere; the campaign baseline of 100 ms is the ranking's, named as such)
    assert counts.best == "8.000 ms (7.50x)"


def best_timed_once_on_a_busy_host() -> Recorder:
    """c0, the best, ran slow in its own run (20 ms); the three kernels that lost to it
    head to head timed it at 12, 12.5 and 13 ms in theirs."""
    log = Recorder()
    log.timed("c0", median_ms=20.0, baseline_ms=100.0, iqr_ms=5.0)
    log.timed("c1", median_ms=30.0, baseline_ms=100.0, versus="c0", faster=False, incumbent_ms=12.0)
    log.timed("c2", median_ms=14.0, baseline_ms=100.0, versus="c0", faster=False, incumbent_ms=12.5)
    log.timed("c3", median_ms=13.5, baseline_ms=100.0, versus="c0", faster=False, incumbent_ms=13.0)
    return log


def test_the_best_s_own_time_is_the_median_of_every_run_that_timed_it(tmp_path: Path) -> None:
    log = best_timed_once_on_a_busy_host()
    candidates = log.history.campaign_candidates(CAMPAIGN)
    times = {k.rsplit(":", 1)[-1]: v for k, v in own_times(candidates).items()}
    assert (times["c0"].median_ns, times["c0"].runs, times["c0"].iqr_ns) == (12.75e6, 4, 5e6)
    assert (times["c3"].median_ns, times["c3"].runs) == (13.5e6, 1)
    # the best stays first by its pooled time; its figure is its own run's, 20 ms
    assert ids(campaign_leaderboard(log.history, CAMPAIGN).rows) == ["c0", "c3", "c2", "c1"]
    assert Progress(log.history, CAMPAIGN).counts().best == "20.000 ms (5.00x)"
    result = run_result(log.history, CAMPAIGN, Console(file=io.StringIO()))
    (best, *_) = result["leaderboard"]
    assert (best["median_ms"], best["speedup"]) == (20.0, 5.0)
    assert (best["pooled_median_ms"], best["runs"]) == (12.75, 4)
    assert best["speedup_vs_campaign_baseline"] == 100 / 12.75
    store = DuckDBEventStore(tmp_path / "events.duckdb")
    store.append([Recorded(e, encode(e)) for e in log.events])
    store.close()
    conn = duckdb.connect(str(tmp_path / "events.duckdb"), read_only=True)
    try:
        rows = conn.execute(
            "SELECT candidate_id, pooled_median_ns, runs, median_ns FROM leaderboard ORDER BY rank"
        ).fetchall()
    finally:
        conn.close()
    assert [(r[0].rsplit(":", 1)[-1], round(r[1]), r[2], round(r[3])) for r in rows] == [
        ("c0", 12_750_000, 4, 20_000_000),
        ("c3", 13_500_000, 1, 13_500_000),
        ("c2", 14_000_000, 1, 14_000_000),
        ("c1", 30_000_000, 1, 30_000_000),
    ]


def test_a_head_to_head_at_another_shape_or_with_malformed_evidence_is_not_a_run(
    tmp_path: Path,
) -> None:
    """A forged value can only sit in a schema 1 event's `evidence` (schema 2's fields are
    checked as they are decoded): the upcaster leaves it there, and it times nothing."""
    log = best_timed_once_on_a_busy_host()
    log.timed("odd", median_ms=1.0, baseline_ms=8.0, versus="c0", incumbent_ms=0.5,
              shape={"rows": 64, "cols": 64})  # fmt: skip
    c4 = log.timed("c4", median_ms=40.0, baseline_ms=100.0, versus="c0", faster=False)
    forged = [e for e in log.events if getattr(e, "candidate_id", "") == c4][-1]
    assert isinstance(forged, BenchmarkCompleted)
    for n, evidence in enumerate(
        (
            {"speedup_vs_incumbent": "fast"},
            {"incumbent": ["c0"], "speedup_vs_incumbent": 0.1},
        )
    ):
        recorded = in_schema_one(forged, **evidence)
        events = [*log.events[:-1], decode(recorded)]
        history = History()
        for position, event in enumerate(events, 1):
            history.apply(position, event)
        times = own_times(history.campaign_candidates(CAMPAIGN))
        assert times[f"{CAMPAIGN}:g0:c0"].runs == 4  # its own, and c1, c2, c3's
        store = DuckDBEventStore(tmp_path / f"events-{n}.duckdb")
        store.append([Recorded(e, encode(e)) for e in events[:-1]])
        store.append([Recorded(events[-1], recorded)])
        store.close()
        conn = duckdb.connect(str(tmp_path / f"events-{n}.duckdb"), read_only=True)
        try:
            runs = conn.execute(
                "SELECT runs FROM leaderboard WHERE candidate_id = ?", [f"{CAMPAIGN}:g0:c0"]
            ).fetchone()
        finally:
            conn.close()
        assert runs == (4,)


def test_a_running_board_ranks_a_growing_list_as_ranking_all_of_it_does() -> None:
    """What `replay` shows per generation, kept as kernels are added instead of ranking
    the list again at each one: the same best and own times, whether the kernels come in
    the order they were timed or not (walked again), at one shape or two (tied: the
    list's order decides)."""
    log = noisy_baselines()
    log.timed("c3", median_ms=7.9, baseline_ms=100.0, versus="c1", faster=False, incumbent_ms=8.1)
    log.timed("small", median_ms=0.5, baseline_ms=4.0, shape={"rows": 64, "cols": 64})
    log.timed("c4", median_ms=6.0, baseline_ms=100.0, versus="c1", faster=True, incumbent_ms=7.9)
    everything = log.history.campaign_candidates(CAMPAIGN)
    for order in (everything, everything[::-1], [everything[4], *everything[:4], everything[5]]):
        board = RunningBoard()
        for count, candidate in enumerate(order, 1):
            board.add([candidate])
            so_far = order[:count]
            assert board.chain() == promotions(so_far)
            times = own_times(so_far)
            assert [board.own_time(c) for c in so_far] == [
                times.get(c.candidate_id) for c in so_far
            ]


def test_a_kernel_that_shifts_work_between_calls_ranks_by_its_mean(tmp_path: Path) -> None:
    """Issue 33, class 2: heavy, light, light calls have a median of a light call. Ranked by
    the mean over its timed calls, the shifter (median 5 ms, mean 10 ms) ranks behind an
    even kernel of 8 ms, and its speedup is over its mean; the SQL view agrees. An event
    recorded before the mean was kept still ranks by its median."""
    log = Recorder()
    log.timed("even", median_ms=8.0, mean_ms=8.0, baseline_ms=100.0, baseline_mean_ms=100.0)
    log.timed("shift", median_ms=5.0, mean_ms=10.0, baseline_ms=100.0, baseline_mean_ms=100.0)
    log.timed("old", median_ms=9.0, baseline_ms=100.0)
    board = by_own_time(log)
    assert [name for name, *_ in board] == ["even", "old", "shift"]
    speedups = [round(speedup or 0.0, 9) for *_, speedup in board]
    assert speedups == [12.5, round(100 / 9, 9), 10.0]
    assert viewed(log, tmp_path / "shift.duckdb") == board
