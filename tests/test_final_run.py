"""The final run (issue 36, item 3): a campaign's top kernels re-timed together in one
interleaved run, and its winner ranked first. Kernels here are planted 3x apart in work,
so no load on the host can flip their order; no test asserts a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

from actors.campaign.campaign_file import CampaignSpec
from actors.campaign.history import Campaign as CampaignState
from actors.campaign.history import History
from actors.campaign.leaderboard import campaign_leaderboard
from actors.records.audit import audit_projections
from actors.roles.benchmarker import FinalJob, decide_final, final_job
from actors.roles.planner import (
    FINAL_RUN_PATIENCE_S,
    decide_deadline,
    decide_planner,
    end_search,
    generation_to_open,
)
from actors.runtime import Reactions
from eventstore.causality import Causality, CausalityBroken
from eventstore.codec import decode, encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.events import (
    ActorRef,
    BenchmarkCompleted,
    CampaignFinished,
    CampaignStarted,
    CandidateProposed,
    Event,
    FinalContender,
    FinalRankingTimed,
    FinalRunRefused,
    FinalRunRequested,
    GenerationOpened,
    HostCalibrated,
    KernelVerified,
    KernelWritten,
    new_event,
)
from eventstore.store import Recorded
from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.cuda.backend import CudaBackend
from gpu_workers.final_run import FinalBuilds, FinalResult
from gpu_workers.results import HostCalibration, Rejection
from kernels.builtin import BUILTIN
from kernels.identity import source_hash
from tests.cpu_support import FLAGS, calibration, cpu_backend, kf_cache
from tests.recorded_campaign import CAMPAIGN_ID as RECORDED_CAMPAIGN
from tests.recorded_campaign import recorded

__all__ = ["calibration", "cpu_backend", "kf_cache"]
SMALL = {"rows": 64, "cols": 1000}


def softmax_repeated(repeat: int) -> str:
    """A right softmax that does its work `repeat` times over."""
    return f"""
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {{
    for (int repeat = 0; repeat < {repeat}; ++repeat)
        for (int64_t r = 0; r < rows; ++r) {{
            const float *xr = x + r * cols;
            float *yr = y + r * cols;
            float m = xr[0], s = 0.0f;
            for (int64_t j = 1; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
            for (int64_t j = 0; j < cols; ++j) s += expf(xr[j] - m);
            for (int64_t j = 0; j < cols; ++j) yr[j] = expf(xr[j] - m) / s;
        }}
}}
"""


WRONG_SOFTMAX = """
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
}
"""


def _builds(backend: CpuBackend, sources: list[str]) -> FinalBuilds[object]:
    problem = BUILTIN["softmax"]
    builds = []
    for source in sources:
        compiled = backend.compile(problem, source, tuple(FLAGS))
        assert compiled.build is not None, compiled.rejection
        builds.append(compiled.build)
    return FinalBuilds(backend, tuple(builds))


def test_the_final_run_orders_kernels_3x_apart_by_their_work(
    cpu_backend: CpuBackend, calibration: HostCalibration
) -> None:
    """Three right kernels doing 9x, 1x and 3x the work, in one interleaved run: every
    contender has the same rounds, and the order is by work."""
    builds = _builds(cpu_backend, [softmax_repeated(9), softmax_repeated(1), softmax_repeated(3)])
    result = builds.time(
        BUILTIN["softmax"], SMALL, llc_bytes=calibration.llc_bytes, max_seconds=3.0, rounds=12
    )
    assert isinstance(result, FinalResult), result
    assert result.order == [1, 2, 0]
    assert all(s.failure is None for s in result.standings)
    assert {s.stats.runs for s in result.standings} == {result.rounds}
    assert 3 <= result.rounds <= 12
    assert result.baseline is not None and result.baseline.runs >= 1


def test_a_contender_wrong_in_the_final_run_is_left_out_of_its_order(
    cpu_backend: CpuBackend, calibration: HostCalibration
) -> None:
    """A kernel that copies its input (fast, and wrong): its judged calls fail, so it
    keeps its times but takes no place, and the right kernel wins."""
    builds = _builds(cpu_backend, [softmax_repeated(1), WRONG_SOFTMAX])
    result = builds.time(
        BUILTIN["softmax"], SMALL, llc_bytes=calibration.llc_bytes, max_seconds=3.0, rounds=6
    )
    assert isinstance(result, FinalResult), result
    assert result.order == [0]
    failure = result.standings[1].failure
    assert failure is not None and failure.stage == "recheck", failure


# --- a campaign whose pooled ranking puts a slower kernel first ------------------------

CAMPAIGN = "final-run"
PLANNER = ActorRef(role="planner", instance="planner-0", host="test")
BENCHMARKER = ActorRef(role="benchmarker", instance="benchmarker-0", host="test")
START = datetime(2026, 1, 1, tzinfo=UTC)


class Campaign:
    """A campaign's events, applied to a History in order, each a second after the last."""

    def __init__(self) -> None:
        self.history = History()
        self.events: list[Event] = []
        spec = CampaignSpec(
            problem="softmax", target="cpu", shapes=[[SMALL["rows"], SMALL["cols"]]]
        )
        self.started = self.emit(
            new_event(
                CampaignStarted,
                campaign_id=CAMPAIGN,
                actor=PLANNER,
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
                actor=PLANNER,
                cause=self.started,
                generation=0,
                planned=3,
            )
        )

    @property
    def campaign(self) -> CampaignState:
        return self.history.campaigns[CAMPAIGN]

    def emit(self, event: Event) -> Event:
        fields = {f: getattr(event, f) for f in event.__struct_fields__}
        event = type(event)(**{**fields, "ts": START + timedelta(seconds=len(self.events))})
        self.history.apply(len(self.events) + 1, event)
        self.events.append(event)
        return event

    def timed(self, name: str, source: str, mean_ms: float) -> str:
        """A kernel written, verified and timed at `mean_ms` (a figure set here: the
        lucky run of a busy host)."""
        candidate_id = f"{CAMPAIGN}:g0:{name}"
        work = {"problem": "softmax", "target": "cpu", "candidate_id": candidate_id}
        digest = source_hash(source, FLAGS)
        proposed = self.emit(
            new_event(
                CandidateProposed,
                campaign_id=CAMPAIGN,
                actor=PLANNER,
                cause=self.opened,
                generation=0,
                template="softmax_rows",
                params={"name": name},
                **work,
            )
        )
        written = self.emit(
            new_event(
                KernelWritten,
                campaign_id=CAMPAIGN,
                actor=PLANNER,
                cause=proposed,
                generation=0,
                source_hash=digest,
                source=source,
                flags=list(FLAGS),
                writer="template",
                **work,
            )
        )
        verified = self.emit(
            new_event(
                KernelVerified,
                campaign_id=CAMPAIGN,
                actor=PLANNER,
                cause=written,
                generation=0,
                source_hash=digest,
                max_rel_err=1e-7,
                trials=72,
                **work,
            )
        )
        self.emit(
            new_event(
                BenchmarkCompleted,
                campaign_id=CAMPAIGN,
                actor=BENCHMARKER,
                cause=verified,
                generation=0,
                source_hash=digest,
                median_ns=mean_ms * 1e6,
                iqr_ns=0.01e6,
                baseline="numpy float32",
                baseline_ns=10e6,
                speedup=10.0 / mean_ms,
                roofline_fraction=0.1,
                shape=SMALL,
                mean_ns=mean_ms * 1e6,
                baseline_mean_ns=10e6,
                **work,
            )
        )
        return candidate_id

    def reactions(self, cause: Event, actor: ActorRef) -> Reactions:
        return Reactions(cause, actor)


def lucky_campaign() -> tuple[Campaign, dict[str, str]]:
    """Three right kernels doing 1x, 3x and 9x the work, recorded as if the slowest had
    been timed fastest (a lucky run each), so the pooled ranking promotes it."""
    log = Campaign()
    ids = {
        "1x": log.timed("c0", softmax_repeated(1), mean_ms=3.0),
        "3x": log.timed("c1", softmax_repeated(3), mean_ms=2.0),
        "9x": log.timed("c2", softmax_repeated(9), mean_ms=1.0),
    }
    return log, ids


def test_the_final_run_puts_the_truly_fastest_first_where_pooled_times_did_not(
    cpu_backend: CpuBackend, calibration: HostCalibration, tmp_path: Path
) -> None:
    """The planner's request, the benchmarker's job and verdict around a real final run:
    before it, rank 1 is the 9x kernel (its lucky pooled time); after it, the 1x kernel,
    decided by the final run, with that run's figures; the audit re-derives the order
    and the SQL view agrees with the read model."""
    log, ids = lucky_campaign()
    before = campaign_leaderboard(log.history, CAMPAIGN)
    assert before.best is not None and before.best.candidate_id == ids["9x"]
    assert before.best.decided_by == "promoted head to head"

    out = log.reactions(log.opened, PLANNER)
    end_search(log.history, log.campaign, "budget reached: 3 candidates", out)
    (request,) = out.events
    assert isinstance(request, FinalRunRequested)
    assert request.contenders == [ids["9x"], ids["3x"], ids["1x"]]
    log.emit(request)
    assert generation_to_open(log.history, request, START) is None  # the search is over

    job = final_job(log.history, request, BUILTIN["softmax"].dims)
    assert isinstance(job, FinalJob)
    builds = _builds(cpu_backend, [source for source, _ in job.kernels])
    result = builds.time(
        BUILTIN["softmax"], SMALL, llc_bytes=calibration.llc_bytes, max_seconds=3.0, rounds=12
    )
    assert isinstance(result, FinalResult), result
    verdict = log.reactions(request, BENCHMARKER)
    decide_final(verdict, job, result, target="cpu", device=calibration.host)
    (timed,) = verdict.events
    assert isinstance(timed, FinalRankingTimed)
    assert timed.order == [ids["1x"], ids["3x"], ids["9x"]]
    log.emit(timed)

    board = campaign_leaderboard(log.history, CAMPAIGN)
    assert [r.candidate_id for r in board.rows] == timed.order
    assert board.best is not None and board.best.candidate_id == ids["1x"]
    assert board.best.decided_by == f"final run of 3 ({timed.rounds} rounds)"
    assert board.best.final == timed.contenders[2]  # its figures in that run

    finish = log.reactions(timed, PLANNER)
    decide_planner(log.history, timed, finish, now=START)
    (finished,) = finish.events
    assert isinstance(finished, CampaignFinished)
    assert finished.reason == "budget reached: 3 candidates"
    assert finished.summary["best"]["candidate_id"] == ids["1x"]
    log.emit(finished)

    claims = audit_projections(enumerate(log.events, 1), CAMPAIGN)
    assert [c for c in claims if c.status == "differs"] == []
    assert_the_view_agrees(log, tmp_path / "events.duckdb")


def assert_the_view_agrees(log: Campaign, path: Path) -> None:
    store = DuckDBEventStore(path)
    store.append([Recorded(e, encode(e)) for e in log.events])
    store.close()
    board = campaign_leaderboard(log.history, CAMPAIGN)
    with duckdb.connect(str(path), read_only=True) as conn:
        viewed = conn.execute(
            "SELECT rank, candidate_id, decided_by, final_mean_ns, final_iqr_ns, final_rounds "
            "FROM leaderboard WHERE campaign_id = ? ORDER BY rank",
            [CAMPAIGN],
        ).fetchall()
    assert viewed == [
        (
            row.rank,
            row.candidate_id,
            row.decided_by,
            row.final.mean_ns if row.final else None,
            row.final.iqr_ns if row.final else None,
            row.final.rounds if row.final else None,
        )
        for row in board.rows
    ]


def ranking_timed(
    campaign_id: str,
    request: Event,
    means_ns: dict[str, tuple[str, float]],
    order: list[str],
    shape: dict[str, int],
    **fields: Any,
) -> FinalRankingTimed:
    """A FinalRankingTimed answering `request`: each contender (id: its source hash and
    mean, a figure set here) with that mean as median and quartiles, over 30 rounds."""
    return new_event(
        FinalRankingTimed,
        campaign_id=campaign_id,
        actor=BENCHMARKER,
        cause=request,
        target="cpu",
        seed=1,
        shape=shape,
        contenders=[
            FinalContender(
                candidate_id=cid,
                source_hash=digest,
                mean_ns=mean,
                median_ns=mean,
                q1_ns=mean,
                q3_ns=mean,
                iqr_ns=0.0,
                rounds=30,
            )
            for cid, (digest, mean) in means_ns.items()
        ],
        order=order,
        rounds=30,
        baseline="numpy float32",
        **{"device": "test-host", **fields},
    )


def log_final(
    log: Campaign, request: Event, means_ms: dict[str, float], order: list[str], **fields: Any
) -> Event:
    """`ranking_timed` of the campaign's own kernels (a kernel it never wrote: a hash of
    zeros), emitted into `log`."""
    hashes = {
        c.candidate_id: c.written.source_hash
        for c in log.history.campaign_candidates(CAMPAIGN)
        if c.written
    }
    means = {cid: (hashes.get(cid, "0" * 64), ms * 1e6) for cid, ms in means_ms.items()}
    return log.emit(ranking_timed(CAMPAIGN, request, means, order, SMALL, **fields))


def forged_final(log: Campaign, order: list[str], means_ms: dict[str, float]) -> Event:
    request = log.emit(
        new_event(
            FinalRunRequested,
            campaign_id=CAMPAIGN,
            actor=PLANNER,
            cause=log.opened,
            problem="softmax",
            target="cpu",
            contenders=list(means_ms),
            reason="budget reached: 3 candidates",
        )
    )
    return log_final(log, request, means_ms, order)


def test_an_order_that_is_not_by_the_run_s_means_is_caught_by_the_audit(tmp_path: Path) -> None:
    """A final run whose recorded order puts a slower mean first: the leaderboard follows
    the order as recorded, and the audit says it is not by mean."""
    log, ids = lucky_campaign()
    forged_final(log, [ids["9x"], ids["1x"]], {ids["1x"]: 1.0, ids["9x"]: 9.0})
    claims = audit_projections(enumerate(log.events, 1), CAMPAIGN)
    (differs,) = [c for c in claims if c.status == "differs"]
    assert "is not its passing contenders by mean" in differs.evidence
    board = campaign_leaderboard(log.history, CAMPAIGN)
    assert [r.decided_by for r in board.rows] == [
        "final run of 2 (30 rounds)",
        "final run of 2 (30 rounds)",
        "pooled time over 1 run",
    ]
    assert_the_view_agrees(log, tmp_path / "events.duckdb")


def test_a_final_run_citing_a_kernel_never_timed_is_refused_by_the_recorder_rule() -> None:
    """The causality rule: every contender a final run cites has its own recorded timing
    in the campaign, and its device was calibrated."""
    log, ids = lucky_campaign()
    timed = forged_final(log, [ids["1x"]], {ids["1x"]: 1.0, f"{CAMPAIGN}:g0:c9": 2.0})
    index = Causality.of(log.events[:-1])
    with pytest.raises(CausalityBroken, match="device"):
        index.check(timed)
    index.note(
        new_event(
            HostCalibrated,
            campaign_id="kf-system",
            actor=BENCHMARKER,
            device="test-host",
            bandwidth_gbs=10.0,
            peak_gflops=100.0,
        )
    )
    with pytest.raises(CausalityBroken, match="c9"):
        index.check(timed)


def test_a_real_campaign_ends_with_its_final_run_and_ranks_its_winner_first(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The session's real campaign (real swarm, nats-server and DuckDB): its search ended,
    its top kernels were timed together before it finished, and the winner of that run is
    rank 1 of its leaderboard, of `run --json`'s, and of the SQL view's."""
    home, result = recorded(tmp_path_factory)
    with duckdb.connect(str(home / "events.duckdb"), read_only=True) as conn:
        payloads = conn.execute(
            "SELECT payload FROM events WHERE campaign_id = ? ORDER BY position",
            [RECORDED_CAMPAIGN],
        ).fetchall()
        viewed = conn.execute(
            "SELECT candidate_id, decided_by FROM leaderboard WHERE campaign_id = ? AND rank = 1",
            [RECORDED_CAMPAIGN],
        ).fetchall()
    events = [decode(str(payload).encode()) for (payload,) in payloads]
    types = [e.type for e in events]
    assert types[-1] == "CampaignFinished"
    assert types.index("FinalRunRequested") < types.index("FinalRankingTimed")
    (final,) = [e for e in events if isinstance(e, FinalRankingTimed)]
    history = History()
    for position, event in enumerate(events, 1):
        history.apply(position, event)
    timed = [c for c in history.campaign_candidates(RECORDED_CAMPAIGN) if c.benchmark]
    assert len(final.contenders) == min(4, len(timed)) >= 2
    assert final.order and all(c.rounds == final.rounds for c in final.contenders)
    board = campaign_leaderboard(history, RECORDED_CAMPAIGN)
    assert board.best is not None and board.best.candidate_id == final.order[0]
    assert result["best"]["candidate_id"] == final.order[0]
    assert result["leaderboard"][0]["decided_by"] == board.best.decided_by
    assert viewed == [(final.order[0], board.best.decided_by)]


def test_a_refused_final_run_is_recorded_and_the_campaign_finishes_on_its_ranking() -> None:
    """A request naming a kernel the campaign never timed is refused with the reason (as a
    back end that cannot make the run is), and the planner finishes the campaign on it."""
    log, ids = lucky_campaign()
    request = log.emit(
        new_event(
            FinalRunRequested,
            campaign_id=CAMPAIGN,
            actor=PLANNER,
            cause=log.opened,
            problem="softmax",
            target="cpu",
            contenders=[ids["1x"], f"{CAMPAIGN}:g0:c9"],
            reason="budget reached: 3 candidates",
        )
    )
    assert isinstance(request, FinalRunRequested)
    job = final_job(log.history, request, BUILTIN["softmax"].dims)
    assert isinstance(job, Rejection) and f"{CAMPAIGN}:g0:c9" in job.message
    out = log.reactions(request, BENCHMARKER)
    decide_final(out, None, job, target="cpu", device="")
    (refused,) = out.events
    assert isinstance(refused, FinalRunRefused) and refused.reason == "final_run_contenders"
    log.emit(refused)
    finish = log.reactions(refused, PLANNER)
    decide_planner(log.history, refused, finish, now=START)
    (finished,) = finish.events
    assert isinstance(finished, CampaignFinished)
    assert finished.reason == "budget reached: 3 candidates"
    assert finished.summary["best"]["candidate_id"] == ids["9x"]  # the ranking as it was
    assert campaign_leaderboard(log.history, CAMPAIGN).best.decided_by == "promoted head to head"


def test_a_final_run_no_benchmarker_takes_does_not_hold_the_campaign() -> None:
    log, _ = lucky_campaign()
    out = log.reactions(log.opened, PLANNER)
    end_search(log.history, log.campaign, "budget reached: wall time", out)
    (request,) = out.events
    log.emit(request)
    waited = log.campaign.final_requested
    assert waited is not None
    soon = log.reactions(request, PLANNER)
    decide_deadline(log.history, CAMPAIGN, soon, now=waited.ts + timedelta(seconds=10))
    assert soon.events == []
    late = log.reactions(request, PLANNER)
    at = waited.ts + timedelta(seconds=FINAL_RUN_PATIENCE_S + 1)
    decide_deadline(log.history, CAMPAIGN, late, now=at)
    (finished,) = late.events
    assert isinstance(finished, CampaignFinished)
    assert finished.reason.startswith("budget reached: wall time; no final run result within")


def test_a_campaign_with_one_timed_kernel_finishes_without_a_final_run() -> None:
    log = Campaign()
    log.timed("c0", softmax_repeated(1), mean_ms=1.0)
    out = log.reactions(log.opened, PLANNER)
    end_search(log.history, log.campaign, "nothing left to try", out)
    (finished,) = out.events
    assert isinstance(finished, CampaignFinished) and finished.reason == "nothing left to try"


def test_the_cuda_back_end_refuses_a_final_run_in_words(tmp_path: Path) -> None:
    """No GPU needed: the CUDA back end says it does not support the run, and the rules
    hand that refusal on (the benchmarker records it as FinalRunRefused)."""
    builds: FinalBuilds[object] = FinalBuilds(CudaBackend(cache_dir=tmp_path), (object(),) * 2)
    refused = builds.time(BUILTIN["softmax"], SMALL, llc_bytes=1 << 20, max_seconds=1.0)
    assert isinstance(refused, Rejection)
    assert refused.reason == "final_run_not_supported" and "cuda" in refused.message
