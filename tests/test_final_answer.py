"""A final answer whenever one is asked for (issue 36, item 3): `kfactory best` says when
its answer is provisional (no final run of the campaign's current top N), and `best
--final-run` has the swarm time them together now, recorded as events, a finished
campaign's too. Real nats-server and DuckDB files for the command; the decisions over a
history built event by event. No test asserts a time."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest

from actors.campaign.campaign_file import CampaignSpec
from actors.campaign.final_answer import final_answer
from actors.campaign.leaderboard import campaign_leaderboard
from actors.records.audit import audit_projections
from actors.roles.benchmarker import FinalJob, final_job
from actors.roles.planner import (
    FINAL_RUN_PATIENCE_S,
    decide_deadline,
    decide_planner,
    end_search,
    generation_to_open,
)
from eventstore.causality import Causality
from eventstore.codec import decode, encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.events import (
    ActorRef,
    BenchmarkCompleted,
    CampaignFinished,
    CampaignResumed,
    CampaignStarted,
    CandidateProposed,
    Event,
    FinalRankingTimed,
    FinalRunRequested,
    GenerationOpened,
    HostCalibrated,
    KernelVerified,
    KernelWritten,
    new_event,
)
from eventstore.ids import derived_event_id
from eventstore.store import Recorded
from gpu_workers.targets import device_missing
from kernels.builtin import BUILTIN
from kernels.identity import source_hash
from tests.recorded_campaign import CAMPAIGN_ID, copy_home, kfactory, recorded
from tests.test_final_run import (
    BENCHMARKER,
    CAMPAIGN,
    PLANNER,
    START,
    Campaign,
    assert_the_view_agrees,
    log_final,
    lucky_campaign,
    ranking_timed,
    softmax_repeated,
)

CLI = ActorRef(role="cli", instance="cli-0", host="test")


def stored(home: Path, campaign_id: str) -> list[Event]:
    with duckdb.connect(str(home / "events.duckdb"), read_only=True) as conn:
        rows = conn.execute(
            "SELECT payload FROM events WHERE campaign_id = ? ORDER BY position", [campaign_id]
        ).fetchall()
    return [decode(str(payload).encode()) for (payload,) in rows]


def row_count(home: Path) -> int:
    with duckdb.connect(str(home / "events.duckdb"), read_only=True) as conn:
        found = conn.execute("SELECT count(*) FROM events").fetchone()
    assert found is not None
    return int(found[0])


def stopped_after_generation_zero(source: Path, target: Path) -> Path:
    """A copy of the recorded campaign's store as a run stopped after its first generation
    closed leaves it: every event after that close is cut (its search had not ended)."""
    home = copy_home(source, target)
    with duckdb.connect(str(home / "events.duckdb")) as conn:
        rows = conn.execute(
            "SELECT position, type FROM events WHERE campaign_id = ? ORDER BY position",
            [CAMPAIGN_ID],
        ).fetchall()
        closes = [p for p, t in rows if t == "GenerationClosed"]
        timed = [p for p, t in rows if t == "BenchmarkCompleted"]
        cut = next(c for c in closes if sum(p < c for p in timed) >= 2)
        assert cut < closes[-1], "the recorded campaign closes a generation with 2 timed first"
        conn.execute("DELETE FROM events WHERE position > ?", [cut])
    return home


def test_a_campaign_stopped_mid_search_is_provisional_until_best_final_run_times_its_top(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Stopped after generation 0: `best` says its answer is provisional (stderr, and
    `provisional` in --json), with the same rank 1 and exit 0. `best --final-run` resumes it
    through a hub and the planner and benchmarker it starts: a FinalRunRequested of the
    current top kernels, their FinalRankingTimed and the CampaignFinished are recorded, rank
    1 is that run's winner, decided by it, and `kfactory audit` agrees with every claim."""
    source, _ = recorded(tmp_path_factory)
    home = stopped_after_generation_zero(source, tmp_path / "stopped")
    before = stored(home, CAMPAIGN_ID)
    assert not any(isinstance(e, FinalRunRequested | CampaignFinished) for e in before)

    text = kfactory("best", CAMPAIGN_ID, "--home", str(home))
    assert text.returncode == 0, text.stderr
    assert f"provisional: campaign {CAMPAIGN_ID} has no final run" in text.stderr
    assert f"kfactory best {CAMPAIGN_ID} --final-run" in text.stderr
    provisional = kfactory("best", CAMPAIGN_ID, "--home", str(home), "--json")
    assert provisional.returncode == 0, provisional.stderr
    told = json.loads(provisional.stdout)
    assert told["provisional"] and "no final run of its current top 2" in told["provisional"]
    assert not told["decided_by"].startswith("final run")

    asked = kfactory("best", CAMPAIGN_ID, "--home", str(home), "--final-run", "--json")
    assert asked.returncode == 0, asked.stderr
    assert "final run of audited asked for" in asked.stderr
    assert "final run done" in asked.stderr
    after = stored(home, CAMPAIGN_ID)[len(before) :]
    assert [e.type for e in after] == [
        "CampaignResumed",
        "FinalRunRequested",
        "FinalRankingTimed",
        "CampaignFinished",
    ]
    resumed, requested, final, finished = after
    assert isinstance(resumed, CampaignResumed) and resumed.end_search
    assert isinstance(requested, FinalRunRequested) and requested.causation_id == resumed.event_id
    assert isinstance(final, FinalRankingTimed) and final.causation_id == requested.event_id
    assert {c.candidate_id for c in final.contenders} == set(requested.contenders)
    assert isinstance(finished, CampaignFinished)
    assert finished.reason == "final answer asked for by kfactory best"
    answer = json.loads(asked.stdout)
    assert answer["provisional"] is None
    assert answer["candidate_id"] == final.order[0]
    assert answer["decided_by"] == f"final run of {len(final.contenders)} ({final.rounds} rounds)"
    assert answer["final_run"]["rounds"] == final.rounds

    audit = kfactory("audit", CAMPAIGN_ID, "--home", str(home), "--json")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    again = kfactory("best", CAMPAIGN_ID, "--home", str(home))
    assert again.returncode == 0 and "provisional" not in again.stderr


def test_a_campaign_finished_with_its_final_run_is_final_and_not_timed_again(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    source, _ = recorded(tmp_path_factory)
    home = copy_home(source, tmp_path / "finished")
    text = kfactory("best", CAMPAIGN_ID, "--home", str(home))
    assert text.returncode == 0, text.stderr
    assert "provisional" not in text.stderr
    as_json = kfactory("best", CAMPAIGN_ID, "--home", str(home), "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["provisional"] is None
    rows = row_count(home)
    asked = kfactory("best", CAMPAIGN_ID, "--home", str(home), "--final-run")
    assert asked.returncode == 0, asked.stderr
    assert "its answer is final already; nothing to time" in asked.stderr
    assert row_count(home) == rows
    assert not (home / "nats").exists()  # no hub was started


VERIFIER = ActorRef(role="verifier", instance="verifier-0", host="test")
DEVICE = "gpu-a"


def two_timed_kernels(campaign_id: str, target: str) -> list[Event]:
    """A campaign with two kernels verified and timed on a calibrated device, as events."""
    spec = CampaignSpec(problem="softmax", target=target, shapes=[[64, 1000]])
    calibrated = new_event(
        HostCalibrated,
        campaign_id="kf-system",
        actor=BENCHMARKER,
        device=DEVICE,
        bandwidth_gbs=1000.0,
        peak_gflops=10000.0,
    )
    started = new_event(
        CampaignStarted,
        campaign_id=campaign_id,
        actor=CLI,
        name=campaign_id,
        problem="softmax",
        target=target,
        config=spec.to_config(),
    )
    opened = new_event(
        GenerationOpened,
        campaign_id=campaign_id,
        actor=PLANNER,
        cause=started,
        generation=0,
        planned=2,
    )
    events: list[Event] = [calibrated, started, opened]
    for index, mean_ms in enumerate([1.0, 2.0]):
        work = {
            "problem": "softmax",
            "target": target,
            "candidate_id": f"{campaign_id}:g0:c{index}",
        }
        kernel = f"__global__ void kernel() {{ /* {index} */ }}\n"
        digest = source_hash(kernel, [])
        proposed = new_event(
            CandidateProposed,
            campaign_id=campaign_id,
            actor=PLANNER,
            cause=opened,
            generation=0,
            template="softmax_rows",
            params={"index": index},
            **work,
        )
        written = new_event(
            KernelWritten,
            campaign_id=campaign_id,
            actor=PLANNER,
            cause=proposed,
            generation=0,
            source_hash=digest,
            source=kernel,
            flags=[],
            writer="template",
            **work,
        )
        verified = new_event(
            KernelVerified,
            campaign_id=campaign_id,
            actor=VERIFIER,
            cause=written,
            generation=0,
            source_hash=digest,
            max_rel_err=1e-7,
            trials=8,
            **work,
        )
        timed = new_event(
            BenchmarkCompleted,
            campaign_id=campaign_id,
            actor=BENCHMARKER,
            cause=verified,
            generation=0,
            source_hash=digest,
            median_ns=mean_ms * 1e6,
            iqr_ns=0.01e6,
            baseline="torch",
            baseline_ns=10e6,
            speedup=10.0 / mean_ms,
            roofline_fraction=0.1,
            shape={"rows": 64, "cols": 1000},
            device=DEVICE,
            mean_ns=mean_ms * 1e6,
            baseline_mean_ns=10e6,
            **work,
        )
        events += [proposed, written, verified, timed]
    return events


def write_store(path: Path, events: list[Event]) -> None:
    store = DuckDBEventStore(path)
    store.append([Recorded(e, encode(e)) for e in events])
    store.close()


@pytest.mark.skipif(
    device_missing("cuda", "benchmarker") is None, reason="this host can time cuda kernels"
)
def test_a_final_run_this_host_cannot_time_is_refused_and_records_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    write_store(home / "events.duckdb", two_timed_kernels("on-a-gpu", "cuda"))
    provisional = kfactory("best", "on-a-gpu", "--home", str(home))
    assert provisional.returncode == 0, provisional.stderr
    assert "provisional: campaign on-a-gpu has no final run" in provisional.stderr
    rows = row_count(home)
    refused = kfactory("best", "on-a-gpu", "--home", str(home), "--final-run")
    assert refused.returncode == 2, refused.stderr
    assert "this host cannot time cuda kernels" in refused.stderr
    assert "nothing was recorded" in refused.stderr
    assert row_count(home) == rows
    assert not (home / "nats").exists()  # no hub was started


@pytest.mark.parametrize("device", [DEVICE, "never-calibrated"])
def test_kfactory_audit_checks_a_final_run_s_device_and_contenders(
    tmp_path: Path, device: str
) -> None:
    """The recorder's causality rule for a final run (its device calibrated, each
    contender timed in the campaign) is re-derived by `kfactory audit` too."""
    events = two_timed_kernels("audited-final", "cpu")
    timed = [e for e in events if isinstance(e, BenchmarkCompleted)]
    request = new_event(
        FinalRunRequested,
        campaign_id="audited-final",
        actor=PLANNER,
        cause=events[-1],
        problem="softmax",
        target="cpu",
        contenders=[e.candidate_id for e in timed],
        reason="budget reached: 2 candidates",
    )
    final = ranking_timed(
        "audited-final",
        request,
        {e.candidate_id: (e.source_hash, e.median_ns) for e in timed},
        [e.candidate_id for e in timed],
        {"rows": 64, "cols": 1000},
        device=device,
    )
    home = tmp_path / "home"
    home.mkdir()
    write_store(home / "events.duckdb", [*events, request, final])
    done = kfactory("audit", "audited-final", "--home", str(home), "--json")
    (claim,) = [c for c in json.loads(done.stdout)["claims"] if c["area"] == "causality"]
    if device == DEVICE:
        assert claim["status"] == "agrees", claim
        assert claim["evidence"].startswith("3 benchmarks and final runs"), claim
    else:
        assert claim["status"] == "differs", claim
        assert "FinalRankingTimed names device 'never-calibrated'" in claim["evidence"], claim
        assert done.returncode == 1


# --- the decisions, over a history built event by event --------------------------------


def answered(log: Campaign, request: Event, means_ms: dict[str, float]) -> FinalRankingTimed:
    """The benchmarker's FinalRankingTimed of `request`, under the id it derives, with these
    means (figures set here), ordered by them."""
    order = sorted(means_ms, key=lambda cid: means_ms[cid])
    benchmarkers_id = derived_event_id(request.event_id, "benchmarker", 0, key=b"")
    final = log_final(log, request, means_ms, order, event_id=benchmarkers_id)
    assert isinstance(final, FinalRankingTimed)
    return final


def test_a_finished_campaign_whose_final_run_misses_a_kernel_timed_since_gets_a_second_one(
    tmp_path: Path,
) -> None:
    """Finished with a final run of its three kernels; a fourth is timed after it (a late
    result) and enters the top 4: the answer is provisional, naming it. A final answer
    asked for (CampaignResumed with end_search) makes the planner request a second final
    run, its id derived from that resume (a redelivery asks under the same id); the
    benchmarker times that one and no longer the first; once it answers, its winner is rank
    1 (the latest final run wins, in the read model and the SQL view), the campaign is not
    finished twice, and the audit and the recorder's causality rule accept it all."""
    log, ids = lucky_campaign()
    log.emit(
        new_event(
            HostCalibrated,
            campaign_id="kf-system",
            actor=BENCHMARKER,
            device="test-host",
            bandwidth_gbs=10.0,
            peak_gflops=100.0,
        )
    )
    out = log.reactions(log.opened, PLANNER)
    end_search(log.history, log.campaign, "budget reached: 3 candidates", out)
    (first,) = out.events
    assert isinstance(first, FinalRunRequested)
    log.emit(first)
    answered(log, first, {ids["1x"]: 1.0, ids["3x"]: 3.0, ids["9x"]: 9.0})
    finish = log.reactions(first, PLANNER)
    decide_planner(log.history, log.events[-1], finish, now=START)
    (finished,) = finish.events
    log.emit(finished)
    assert final_answer(log.history, CAMPAIGN).final

    late = log.timed("c3", softmax_repeated(2), mean_ms=0.5)
    answer = final_answer(log.history, CAMPAIGN)
    assert answer.untimed == [late]
    assert answer.provisional() is not None and "did not time g0:c3" in str(answer.provisional())
    stale = campaign_leaderboard(log.history, CAMPAIGN).best
    assert stale is not None and stale.candidate_id == ids["1x"]

    resume = log.emit(new_event(CampaignResumed, campaign_id=CAMPAIGN, actor=CLI, end_search=True))
    assert isinstance(resume, CampaignResumed)
    assert generation_to_open(log.history, resume, START) is None
    asked = log.reactions(resume, PLANNER)
    decide_planner(log.history, resume, asked, now=START)
    (second,) = asked.events
    assert isinstance(second, FinalRunRequested)
    assert second.event_id == derived_event_id(resume.event_id, "final-run", key=b"")
    assert second.event_id != first.event_id
    assert set(second.contenders) == {*ids.values(), late}
    log.emit(second)
    redelivered = log.reactions(resume, PLANNER)
    decide_planner(log.history, resume, redelivered, now=START)
    assert [e.event_id for e in redelivered.events] == [second.event_id]  # stored once

    assert final_job(log.history, first, BUILTIN["softmax"].dims) is None  # replaced
    job = final_job(log.history, second, BUILTIN["softmax"].dims)
    assert isinstance(job, FinalJob) and job.candidate_ids == second.contenders

    means = {ids["1x"]: 1.0, ids["3x"]: 3.0, ids["9x"]: 9.0, late: 0.6}
    timed = answered(log, second, means)
    Causality.of(log.events[:-1]).check(timed)  # raises CausalityBroken if it breaks the rule
    assert log.campaign.final_run is timed and log.campaign.final_ranking is timed
    board = campaign_leaderboard(log.history, CAMPAIGN)
    assert board.best is not None and board.best.candidate_id == late
    assert board.best.decided_by == "final run of 4 (30 rounds)"
    assert final_answer(log.history, CAMPAIGN).final
    assert final_job(log.history, second, BUILTIN["softmax"].dims) is None  # answered

    after = log.reactions(timed, PLANNER)
    decide_planner(log.history, timed, after, now=START)
    assert after.events == []  # finished once

    claims = audit_projections(enumerate(log.events, 1), CAMPAIGN)
    assert [c for c in claims if c.status == "differs"] == []
    assert_the_view_agrees(log, tmp_path / "events.duckdb")


def test_a_final_run_given_up_on_when_the_campaign_finished_is_not_timed_later() -> None:
    """The planner's patience ran out and the campaign finished without its final run: a
    benchmarker that joins later does not time that request (a later campaign never waits
    on it)."""
    log, _ = lucky_campaign()
    out = log.reactions(log.opened, PLANNER)
    end_search(log.history, log.campaign, "budget reached: wall time", out)
    request = log.emit(out.events[0])
    late = log.reactions(request, PLANNER)
    decide_deadline(
        log.history, CAMPAIGN, late, now=request.ts + timedelta(seconds=FINAL_RUN_PATIENCE_S + 1)
    )
    (finished,) = late.events
    log.emit(finished)
    assert isinstance(request, FinalRunRequested)
    assert final_job(log.history, request, BUILTIN["softmax"].dims) is None
