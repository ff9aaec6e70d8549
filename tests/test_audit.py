"""`kfactory audit`, `replay` and `best` on a real recorded campaign, and on copies of it
that were tampered with in every way the issue names."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.campaign.campaign_file import Budget, CampaignSpec
from actors.campaign.history import History
from actors.campaign.ranking import best_of
from actors.campaign.summary import summary
from actors.records.audit import lessons_due
from eventstore.codec import decode, encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.events import (
    SYSTEM_CAMPAIGN,
    ActorRef,
    BenchmarkCompleted,
    CampaignFinished,
    CampaignStarted,
    CandidateProposed,
    Event,
    GenerationClosed,
    GenerationOpened,
    HostCalibrated,
    KernelCompiled,
    KernelVerified,
    KernelWritten,
    LessonLearned,
    new_event,
)
from eventstore.ids import derived_event_id
from eventstore.store import GENESIS, Recorded, chain_hash
from gpu_workers.cuda.nvcc import nvcc_path
from gpu_workers.targets import device_missing
from kernels.identity import source_hash
from kernels.templates import example_kernel
from tests.recorded_campaign import (
    CAMPAIGN_ID,
    Row,
    copy_home,
    kfactory,
    read_rows,
    rechain,
    recorded,
    set_payload,
    write_rows,
)


@pytest.fixture
def home(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    source, _ = recorded(tmp_path_factory)
    return copy_home(source, tmp_path / "copy")


def audit(home: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    done = kfactory("audit", CAMPAIGN_ID, "--home", str(home), "--json", *args)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr


def differing(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in report["claims"] if c["status"] == "differs"]


def campaign_rows(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r["campaign_id"] == CAMPAIGN_ID]


def of_type(rows: list[Row], kind: str) -> list[Row]:
    return [r for r in campaign_rows(rows) if r["type"] == kind]


# --- an intact campaign --------------------------------------------------------------


def test_an_intact_campaign_agrees_everywhere(home: Path) -> None:
    code, report, _ = audit(home)
    assert code == 0, differing(report)
    assert report["ok"] is True
    names = {c["name"] for c in report["claims"] if c["status"] == "agrees"}
    for expected in ("leaderboard", "dedupe index", "lessons", "summary", "finish reason"):
        assert expected in names, names
    assert any(n.startswith("hash chain") for n in names)


def test_replay_reproduces_the_live_projections_exactly(
    home: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _, live = recorded(tmp_path_factory)
    done = kfactory("replay", CAMPAIGN_ID, "--home", str(home), "--json")
    assert done.returncode == 0, done.stderr
    told = json.loads(done.stdout)
    assert told["state"] == "finished" and told["finish_reason"] == live["finished"]
    # `run --json` names the winner's parameters and the file it was written to.
    assert live["best"]["params"] and live["best"]["template"]
    assert Path(live["best"]["path"]).read_text().startswith("// kfactory-flags: ")
    assert told["evaluated"] == live["evaluated"]
    assert told["duplicates_avoided"] == live["duplicates_avoided"]
    assert len(told["generations"]) == live["generations"]
    # The answer is the leaderboard's rank 1: the final run's winner, which need not be the
    # incumbent the last generation promoted head to head.
    best = told["best"]
    assert best["candidate_id"] == live["best"]["candidate_id"]
    assert best["speedup"] == live["best"]["speedup"]
    assert best["median_ns"] == live["best"]["median_ns"]
    assert best["decided_by"] == live["best"]["decided_by"]
    # The incumbent was one of the final run's contenders.
    contenders = {row["candidate"] for row in live["leaderboard"] if row["final_run"]}
    assert told["generations"][-1]["best_so_far"]["candidate_id"] in contenders
    rejected: dict[str, int] = {}
    for r in told["rejections"]:
        rejected[r["stage"]] = rejected.get(r["stage"], 0) + r["count"]
    assert rejected == live["rejected_by_stage"]
    # What the live actors recorded (each close, every lesson, the summary) is re-derived.
    _, report, _ = audit(home)
    for name in ("leaderboard", "lessons", "summary", "dedupe index"):
        assert {c["status"] for c in report["claims"] if c["name"] == name} == {"agrees"}


def test_replay_at_a_position_shows_the_state_of_that_moment(home: Path) -> None:
    rows = campaign_rows(read_rows(home))
    first_close = of_type(rows, "GenerationClosed")[0]["position"]
    done = kfactory("replay", CAMPAIGN_ID, "--home", str(home), "--json", "--at", str(first_close))
    assert done.returncode == 0, done.stderr
    early = json.loads(done.stdout)
    assert early["position"] == first_close
    assert early["state"] == "running"
    assert [g["closed"] for g in early["generations"]] == [True]
    at_time = str(rows[0]["ts"].isoformat())
    done = kfactory("replay", CAMPAIGN_ID, "--home", str(home), "--json", "--at", at_time)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["generations"] == []
    human = kfactory("replay", CAMPAIGN_ID, "--home", str(home))
    assert human.returncode == 0 and "best so far" in human.stdout


def test_best_writes_a_kernel_that_check_accepts_unchanged(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "best.c"
    done = kfactory("best", CAMPAIGN_ID, "--home", str(home), "-o", str(path), "--json")
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    assert described["path"] == str(path) and described["params"]
    assert path.read_text().startswith("// kfactory-flags: ")
    check = kfactory("check", "softmax", "--source", str(path), "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads(check.stdout)["verdict"] == "verified"
    several = kfactory(
        "best",
        CAMPAIGN_ID,
        "--home",
        str(home),
        "--top",
        "2",
        "-o",
        str(tmp_path / "top"),
        "--json",
    )
    assert several.returncode == 0, several.stderr
    assert [Path(x["path"]).exists() for x in json.loads(several.stdout)] == [True, True]


# --- tampering: each is caught, with a non-zero exit that names the position -----------


def test_an_edited_payload_is_caught_at_its_position(home: Path) -> None:
    rows = read_rows(home)
    target = of_type(rows, "BenchmarkCompleted")[0]
    target["payload"] = str(target["payload"]).replace('"speedup":', '"speedup":1', 1)
    write_rows(home, rows, renumber=False)
    code, report, _ = audit(home)
    assert code == 1
    assert any(c["position"] == target["position"] for c in differing(report)), report


@pytest.mark.parametrize(
    ("column", "edit"),
    [
        ("ts", lambda ts: ts - timedelta(hours=1)),
        ("actor_host", lambda host: "gpu-host-7"),
        ("stream_seq", lambda seq: seq + 1),
    ],
)
def test_an_edited_column_the_payload_does_not_hash_as_such_is_caught(
    home: Path, column: str, edit: Callable[[Any], Any]
) -> None:
    """Issue 34: `ts`, `actor_host` and `stream_seq` could be edited unnoticed."""
    rows = read_rows(home)
    target = of_type(rows, "BenchmarkCompleted")[0]
    target[column] = edit(target[column])
    write_rows(home, rows, renumber=False)
    code, report, _ = audit(home)
    assert code == 1, report
    assert [c["position"] for c in differing(report)] == [target["position"]], report


def test_a_store_chained_before_the_sequence_was_covered_audits_under_the_old_rule(
    home: Path,
) -> None:
    """Chain rule 1 hashed the payload alone: such links are verified under it and the
    audit says so; a rule-1 link after rule-2 links of the campaign is an edit."""
    rows = read_rows(home)
    heads: dict[str, bytes] = {}
    for row in rows:  # every link as a store written before rule 2 holds it
        row["chain_hash"] = chain_hash(
            str(row["payload"]).encode(), heads.get(row["campaign_id"], GENESIS)
        )
        heads[row["campaign_id"]] = row["chain_hash"]
    write_rows(home, rows, renumber=False)
    code, report, _ = audit(home)
    assert code == 0, differing(report)
    chain = next(c for c in report["claims"] if c["name"].startswith("hash chain of"))
    assert "verified under rule 1" in chain["evidence"], chain

    rows = read_rows(home)
    ours = campaign_rows(rows)
    half = len(ours) // 2
    previous = GENESIS
    for index, row in enumerate(ours):  # rule 2 up to half, then rule 1: as if edited
        sequence = int(row["stream_seq"]) if index < half else None
        row["chain_hash"] = previous = chain_hash(str(row["payload"]).encode(), previous, sequence)
    write_rows(home, rows, renumber=False)
    code, report, _ = audit(home)
    assert code == 1
    edited = differing(report)
    assert edited[0]["position"] == ours[half]["position"], edited
    assert all("stream_seq" in c["evidence"] for c in edited), edited


def test_a_deleted_event_is_caught_at_its_position(home: Path) -> None:
    rows = read_rows(home)
    gone = of_type(rows, "KernelVerified")[0]
    rows.remove(gone)
    write_rows(home, rows, renumber=False)
    code, report, _ = audit(home)
    assert code == 1
    found = differing(report)
    assert any(c["position"] == gone["position"] and "removed" in c["evidence"] for c in found)


def test_an_inserted_event_is_caught_at_its_position(home: Path) -> None:
    rows = read_rows(home)
    lesson = of_type(rows, "LessonLearned")[0]
    forged = msgspec.structs.replace(
        decode(str(lesson["payload"]).encode()),
        event_id=derived_event_id(lesson["event_id"], "forged", key=b""),
        statement="every kernel is correct",
    )
    copy = dict(lesson, event_id=forged.event_id)
    set_payload(copy, forged)
    at = rows.index(lesson) + 1
    rows.insert(at, copy)
    write_rows(home, rows)  # positions renumbered: no gap betrays it
    code, report, _ = audit(home)
    assert code == 1
    assert any(
        c["position"] == at + 1 and "inserted" in c["evidence"] for c in differing(report)
    ), report


def test_two_swapped_events_are_caught_at_their_positions(home: Path) -> None:
    rows = read_rows(home)
    own = campaign_rows(rows)
    a, b = own[3], own[4]
    i, j = rows.index(a), rows.index(b)
    rows[i], rows[j] = b, a
    a["position"], b["position"] = b["position"], a["position"]
    write_rows(home, rows, renumber=False)
    code, report, _ = audit(home)
    assert code == 1
    chain = [c for c in differing(report) if c["area"] == "chain"]
    assert len(chain) == 1, chain  # one break, named as the swap it is
    assert chain[0]["position"] == b["position"] and "swapped" in chain[0]["evidence"]


def test_a_truncated_tail_is_caught_against_an_exported_head(home: Path) -> None:
    heads = kfactory("audit", "--export-head", "--home", str(home), "--json")
    assert heads.returncode == 0, heads.stderr
    head = next(h for h in json.loads(heads.stdout) if h["campaign_id"] == CAMPAIGN_ID)
    rows = read_rows(home)
    cut = campaign_rows(rows)[-2:]  # the final run and the finish
    assert [r["type"] for r in cut] == ["FinalRankingTimed", "CampaignFinished"]
    rows = [r for r in rows if r not in cut]
    write_rows(home, rows)  # renumbered, so the chain and positions alone look intact
    code, report, _ = audit(home)
    assert code == 0, f"without the anchor this clean cut cannot be seen: {differing(report)}"
    code, report, _ = audit(home, "--expect-head", head["head"])
    assert code == 1
    last = campaign_rows(rows)[-1]["position"]
    assert any(
        c["name"] == "exported head" and c["position"] == last and "truncated" in c["evidence"]
        for c in differing(report)
    ), report


def test_the_exported_head_line_is_accepted_verbatim(home: Path) -> None:
    """Issue 34: the line `--export-head` prints, passed as it is, reported a false
    "tail truncated"."""
    heads = kfactory("audit", CAMPAIGN_ID, "--export-head", "--home", str(home))
    assert heads.returncode == 0, heads.stderr
    line = heads.stdout.strip()
    code, report, _ = audit(home, "--expect-head", line)
    assert code == 0, differing(report)
    code, report, _ = audit(home, "--expect-head", line.replace(CAMPAIGN_ID, "other", 1))
    assert code == 1 and "not " + CAMPAIGN_ID in str(differing(report))


def test_a_kernel_source_altered_after_the_fact_is_caught(home: Path) -> None:
    rows = read_rows(home)
    written = of_type(rows, "KernelWritten")[0]
    event = decode(str(written["payload"]).encode())
    assert isinstance(event, KernelWritten)
    set_payload(written, msgspec.structs.replace(event, source=event.source + "\n// edited\n"))
    rechain(rows)  # the chain itself is rebuilt: only the kernel's identity tells
    write_rows(home, rows, renumber=False)
    code, report, _ = audit(home)
    assert code == 1
    found = differing(report)
    assert [c["name"] for c in found] == ["sources match their hashes"], found
    assert found[0]["position"] == written["position"]


# --- a claim that does not reproduce ------------------------------------------------------


def forge_faster(rows: list[Row], factor: float) -> str:
    """Make the best kernel `factor` times faster on paper, and rewrite everything derived
    from it (closes, lessons, summary) and the chain, as a careful forger would."""
    timed = [(r, decode(str(r["payload"]).encode())) for r in of_type(rows, "BenchmarkCompleted")]
    row, best = max(timed, key=lambda pair: getattr(pair[1], "speedup", 0.0))
    assert isinstance(best, BenchmarkCompleted)
    set_payload(
        row,
        msgspec.structs.replace(
            best,
            speedup=best.speedup * factor,
            median_ns=best.median_ns / factor,
            mean_ns=None if best.mean_ns is None else best.mean_ns / factor,
            iqr_ns=best.iqr_ns / factor,
            roofline_fraction=best.roofline_fraction * factor,
        ),
    )
    history = History()
    rewritten: list[Row] = []
    applied = iter(range(1, 10**9))
    for row in rows:
        event: Event = decode(str(row["payload"]).encode())
        ours = event.campaign_id == CAMPAIGN_ID
        if ours and isinstance(event, LessonLearned):
            continue  # redrawn below, from the forged history
        if ours and isinstance(event, GenerationClosed):
            template = next(r for r in rows if r["type"] == "LessonLearned")
            for index, lesson in enumerate(lessons_due(history, CAMPAIGN_ID)):
                drawn = LessonLearned(
                    event_id=derived_event_id(row["event_id"], "forged-lesson", index, key=b""),
                    campaign_id=CAMPAIGN_ID,
                    actor=event.actor,
                    ts=event.ts,
                    generation=event.generation,
                    kind=lesson.kind,
                    statement=lesson.statement,
                    evidence_ids=lesson.evidence_ids,
                    data=lesson.data,
                )
                copy = dict(template, event_id=drawn.event_id, type="LessonLearned")
                set_payload(copy, drawn)
                history.apply(next(applied), drawn)
                rewritten.append(copy)
            state = history.campaigns[CAMPAIGN_ID].generations[event.generation]
            members = [history.candidates[c] for c in state.candidates]
            top = best_of(members)  # as the librarian closes a generation
            assert top is not None
            event = msgspec.structs.replace(
                event, best_candidate=top.candidate_id, best_speedup=top.speedup
            )
            set_payload(row, event)
        if ours and isinstance(event, CampaignFinished):
            event = msgspec.structs.replace(
                event, summary=summary(history, history.campaigns[CAMPAIGN_ID])
            )
            set_payload(row, event)
        history.apply(next(applied), event)
        rewritten.append(row)
    rows[:] = rewritten
    rechain(rows)
    return str(best.candidate_id)


@pytest.mark.timeout(600)
def test_a_planted_speedup_is_reported_as_differs_by_re_measurement(home: Path) -> None:
    rows = read_rows(home)
    planted = forge_faster(rows, factor=25.0)  # far beyond the noise of a busy host
    write_rows(home, rows)
    code, report, _ = audit(home)
    assert code == 0, f"the forgery should pass every check but re-measurement: {report}"
    code, report, _ = audit(home, "--reverify", "1")
    assert code == 1
    found = differing(report)
    assert len(found) == 1 and found[0]["area"] == "reverify", found
    assert planted in found[0]["name"] and "does not reproduce" in found[0]["evidence"]


# --- a campaign recorded on a GPU host, audited here --------------------------------------


def record_gpu_campaign(home: Path) -> None:
    """A one-kernel cuda campaign as a GPU host records it (the derived facts drawn by the
    actors' own code), stored here where there is no GPU."""
    rendered = example_kernel("softmax", "cuda", "fp32")
    assert rendered is not None
    gpu = ActorRef(role="benchmarker", instance="benchmarker-0", host="gpu-host")
    store = DuckDBEventStore(home / "events.duckdb")
    history = History()
    emitted: list[Event] = []

    def emit(event: Event) -> Event:
        history.apply(len(emitted) + 1, event)
        emitted.append(event)
        return event

    spec = CampaignSpec(problem="softmax", target="cuda", budget=Budget(candidates=1))
    start = emit(
        new_event(
            CampaignStarted,
            campaign_id="gpu",
            actor=gpu,
            name="gpu",
            problem="softmax",
            target="cuda",
            config=spec.to_config(),
        )
    )
    opened = emit(
        new_event(
            GenerationOpened, campaign_id="gpu", actor=gpu, cause=start, generation=0, planned=1
        )
    )
    work = {"problem": "softmax", "target": "cuda", "candidate_id": "gpu:g0:c0", "generation": 0}
    identity = source_hash(rendered.source, list(rendered.flags))
    proposed = emit(
        new_event(
            CandidateProposed,
            campaign_id="gpu",
            actor=gpu,
            cause=opened,
            template="softmax_cuda_rows",
            **work,
        )
    )
    written = emit(
        new_event(
            KernelWritten,
            campaign_id="gpu",
            actor=gpu,
            cause=proposed,
            source_hash=identity,
            source=rendered.source,
            flags=list(rendered.flags),
            writer="template",
            **work,
        )
    )
    compiled = emit(
        new_event(
            KernelCompiled,
            campaign_id="gpu",
            actor=gpu,
            cause=written,
            source_hash=identity,
            arch="sm_90",
            resources=[],
            **work,
        )
    )
    verified = emit(
        new_event(
            KernelVerified,
            campaign_id="gpu",
            actor=ActorRef(role="verifier", instance="verifier-0", host="gpu-host"),
            cause=compiled,
            source_hash=identity,
            max_rel_err=1e-7,
            trials=20,
            **work,
        )
    )
    emit(
        new_event(
            HostCalibrated,
            campaign_id=SYSTEM_CAMPAIGN,
            actor=gpu,
            device="H200",
            bandwidth_gbs=4800.0,
            peak_gflops=60_000.0,
        )
    )
    emit(
        new_event(
            BenchmarkCompleted,
            campaign_id="gpu",
            actor=gpu,
            cause=verified,
            source_hash=identity,
            median_ns=1e5,
            iqr_ns=1e3,
            baseline="torch eager",
            baseline_ns=2e5,
            speedup=2.0,
            roofline_fraction=0.5,
            device="H200",
            **work,
        )
    )
    for index, lesson in enumerate(lessons_due(history, "gpu")):
        emit(
            new_event(
                LessonLearned,
                campaign_id="gpu",
                actor=gpu,
                cause=opened,
                event_id=derived_event_id(opened.event_id, "lesson", index, key=b""),
                generation=0,
                kind=lesson.kind,
                statement=lesson.statement,
                evidence_ids=lesson.evidence_ids,
                data=lesson.data,
            )
        )
    emit(
        new_event(
            GenerationClosed,
            campaign_id="gpu",
            actor=gpu,
            cause=opened,
            generation=0,
            settled=1,
            evaluated=1,
            best_candidate="gpu:g0:c0",
            best_speedup=2.0,
        )
    )
    emit(
        new_event(
            CampaignFinished,
            campaign_id="gpu",
            actor=gpu,
            cause=start,
            reason="budget reached: 1 candidates",
            summary=summary(history, history.campaigns["gpu"]),
        )
    )
    store.append([Recorded(e, encode(e)) for e in emitted])
    store.close()


def test_a_gpu_campaign_is_audited_on_a_cpu_host_as_far_as_it_can_go(tmp_path: Path) -> None:
    if device_missing("cuda") is None:
        pytest.skip("this host has a GPU: the cuda kernels would run here")
    record_gpu_campaign(tmp_path)
    strict = kfactory("audit", "gpu", "--home", str(tmp_path), "--reverify", "1", "--json")
    assert strict.returncode == 1, "a claim it could not re-run must not pass the audit"
    assert json.loads(strict.stdout)["not_reverifiable_here"] == ["#1 gpu:g0:c0"]
    done = kfactory(
        "audit", "gpu", "--home", str(tmp_path), "--reverify", "1", "--json",
        "--allow-unverifiable",
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert done.returncode == 0, differing(report)
    kernel = [c for c in report["claims"] if c["area"] == "reverify"]
    assert [c["status"] for c in kernel][-1] == "unverifiable", kernel
    assert "not run" in kernel[-1]["evidence"] or "not compiled here" in kernel[-1]["evidence"]
    if nvcc_path() is not None:  # compile and static checks happen on any host with nvcc
        assert kernel[0]["status"] == "agrees" and "static" in kernel[0]["evidence"]
    projections = {c["name"]: c["status"] for c in report["claims"] if c["area"] == "projection"}
    assert projections["leaderboard"] == projections["lessons"] == "agrees", projections
