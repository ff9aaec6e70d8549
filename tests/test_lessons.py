"""Lessons that say how sure they are and cite a bounded sample of their evidence: drawn
from synthetic histories (real events, applied as the librarian applies them), and an
old store whose lessons were recorded under the first rule, audited from a real DuckDB
file by `kfactory audit`."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.campaign.campaign_file import Budget, CampaignSpec
from actors.campaign.history import History, param_key
from actors.campaign.ranking import best_of, promotions
from actors.records.audit import audit_projections, lessons_due
from actors.search.lessons import (
    MAX_EVIDENCE,
    RULE,
    Lesson,
    draw_lessons,
    lesson_rule,
    parameter_effects,
    prunes,
    regions_to_avoid,
)
from eventstore.codec import encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.events import (
    ActorRef,
    BenchmarkCompleted,
    CampaignStarted,
    CandidateProposed,
    Event,
    GenerationClosed,
    GenerationOpened,
    HostCalibrated,
    KernelRejected,
    KernelVerified,
    KernelWritten,
    LessonLearned,
)
from eventstore.ids import derived_event_id
from eventstore.store import Recorded
from kernels.identity import source_hash
from tests.recorded_campaign import kfactory

CAMPAIGN = "lessons"
TEMPLATE = "rows"
ACTOR = ActorRef(role="librarian", instance="librarian-0", host="test")
VERIFIER = ActorRef(role="verifier", instance="verifier-0", host="test")
BENCHMARKER = ActorRef(role="benchmarker", instance="benchmarker-0", host="test")
DEVICE = "cpu.test"
START = datetime(2026, 1, 1, tzinfo=UTC)
FAST_MATH = "-O3 -march=native -ffast-math"
PLAIN = "-O3 -march=native"
NAN = "out[3] is 0.5 where the reference gives nan; 12 elements lose the reference's NaN"


class Campaign:
    """One campaign's events, applied to a History in order, with increasing times."""

    def __init__(self, campaign_id: str = CAMPAIGN) -> None:
        self.campaign_id = campaign_id
        self.history = History()
        self.events: list[Event] = []
        self.generation = -1
        self.opened: GenerationOpened | None = None
        self.members = 0
        spec = CampaignSpec(problem="softmax", target="cpu", budget=Budget(candidates=10_000))
        self.emit(
            CampaignStarted,
            name=campaign_id,
            problem="softmax",
            target="cpu",
            config=spec.to_config(),
        )

    def emit(self, event_type: type[Event], **payload: Any) -> Any:
        event = event_type(
            event_id=payload.pop("event_id", f"{self.campaign_id}-{len(self.events):06d}"),
            campaign_id=self.campaign_id,
            actor=payload.pop("actor", ACTOR),
            ts=payload.pop("ts", START + timedelta(seconds=len(self.events))),
            **payload,
        )
        self.history.apply(len(self.events) + 1, event)
        self.events.append(event)
        return event

    def open(self) -> None:
        self.generation += 1
        self.members = 0
        self.opened = self.emit(GenerationOpened, generation=self.generation, planned=0)

    def candidate(
        self,
        params: dict[str, Any],
        *,
        speedup: float | None = None,
        rejected: tuple[str, str, str] | None = None,
        flags: list[str] | None = None,
        timed_at: datetime | None = None,
    ) -> str:
        """A kernel of TEMPLATE proposed, written and then timed at `speedup` (at
        `timed_at`, by default now) or rejected with (stage, reason, message)."""
        if self.opened is None:
            self.open()
        candidate_id = f"{self.campaign_id}:g{self.generation}:c{self.members}"
        self.members += 1
        work = {
            "problem": "softmax",
            "target": "cpu",
            "candidate_id": candidate_id,
            "generation": self.generation,
        }
        key = param_key(TEMPLATE, params)
        self.emit(CandidateProposed, template=TEMPLATE, params=params, param_key=key, **work)
        written = flags if flags is not None else str(params.get("flags", PLAIN)).split()
        source = f"/* {candidate_id} */"
        digest = source_hash(source, written)
        self.emit(
            KernelWritten,
            source_hash=digest,
            source=source,
            flags=written,
            writer="template",
            **work,
        )
        if rejected is not None:
            stage, reason, message = rejected
            self.emit(
                KernelRejected,
                source_hash=digest,
                stage=stage,
                reason=reason,
                evidence={"message": message},
                **work,
            )
            return candidate_id
        self.emit(
            KernelVerified,
            actor=VERIFIER,
            source_hash=digest,
            max_rel_err=1e-7,
            trials=20,
            **work,
        )
        assert speedup is not None
        if not any(isinstance(e, HostCalibrated) for e in self.events):
            self.emit(
                HostCalibrated, actor=BENCHMARKER, device=DEVICE, bandwidth_gbs=1, peak_gflops=1
            )
        self.emit(
            BenchmarkCompleted,
            actor=BENCHMARKER,
            device=DEVICE,
            source_hash=digest,
            median_ns=1e6 / speedup,
            iqr_ns=1e3,
            baseline="numpy float32",
            baseline_ns=1e6,
            speedup=speedup,
            roofline_fraction=0.1,
            **({"ts": timed_at} if timed_at else {}),
            **work,
        )
        return candidate_id

    def close(self, lessons: list[Lesson]) -> None:
        """The generation's lessons and close, as the librarian records them."""
        assert self.opened is not None
        for index, lesson in enumerate(lessons):
            self.emit(
                LessonLearned,
                event_id=derived_event_id(self.opened.event_id, "lesson", index, key=b""),
                generation=self.generation,
                kind=lesson.kind,
                statement=lesson.statement,
                evidence_ids=lesson.evidence_ids,
                data=lesson.data,
            )
        state = self.history.campaigns[self.campaign_id].generations[self.generation]
        members = [self.history.candidates[c] for c in state.candidates]
        best = best_of(members)
        self.emit(
            GenerationClosed,
            generation=self.generation,
            settled=len(members),
            evaluated=sum(1 for c in members if c.evaluated),
            best_candidate=best.candidate_id if best else None,
            best_speedup=best.speedup if best else None,
        )
        self.opened = None


def regions(lessons: list[Lesson], param: str, value: Any) -> list[Lesson]:
    return [x for x in lessons if x.data.get("param") == param and x.data.get("value") == value]


def pruned(lessons: list[Lesson]) -> list[tuple[str, Any]]:
    return [(x.data["param"], x.data["value"]) for x in lessons if prunes(x.data)]


# --- regions avoided only on significant evidence -------------------------------------


def test_two_failures_of_a_value_no_longer_prune_the_space() -> None:
    """Issue 35: "every candidate with block=256 failed ... avoid it", from 2 samples."""
    campaign = Campaign()
    rng = random.Random(3)
    for block in (64, 128, 64, 128, 64, 128, 64, 128):
        campaign.candidate({"block": block, "unroll": rng.choice([1, 2])}, speedup=2.0)
    for _ in range(2):
        campaign.candidate(
            {"block": 256, "unroll": rng.choice([1, 2])},
            rejected=("compare", "mismatch", "element 7 differs"),
        )
    lessons = draw_lessons(campaign.history, CAMPAIGN)
    assert pruned(lessons) == []
    assert regions(lessons, "block", 256) == []  # too few to say anything about the value
    # What did happen is still said, with its reason and count.
    (failures,) = [x for x in lessons if x.data.get("reason") == "mismatch"]
    assert failures.statement.startswith("2 of 10 evaluated candidate(s) rejected at compare")
    assert failures.data["count"] == 2 and failures.data["evaluated"] == 10


@pytest.mark.parametrize("flag_is_a_parameter", [True, False])
def test_nan_failures_under_fast_math_name_the_flag_and_the_reason_not_the_block_size(
    flag_is_a_parameter: bool,
) -> None:
    """Every block=256 kernel failed, but each was built with -ffast-math, which lost the
    reference's NaNs at every block size: the block size only co-occurred."""
    campaign = Campaign()
    rng = random.Random(5)
    plan = [(256, True)] * 5 + [(128, True)] * 4 + [(512, True)] * 3
    plan += [(block, False) for block in (64, 128, 512) for _ in range(10)]
    rng.shuffle(plan)
    for block, fast in plan:
        params: dict[str, Any] = {"block": block, "unroll": rng.choice([1, 2, 4])}
        if flag_is_a_parameter:
            params["flags"] = FAST_MATH if fast else PLAIN
        flags = (FAST_MATH if fast else PLAIN).split()
        if fast:
            campaign.candidate(params, rejected=("compare", "lost_non_finite", NAN), flags=flags)
        else:
            campaign.candidate(params, speedup=rng.uniform(1.5, 2.5), flags=flags)
    lessons = draw_lessons(campaign.history, CAMPAIGN)
    (block,) = regions(lessons, "block", 256)
    assert not prunes(block.data)
    carrier = block.data["carried_by"]
    assert "lost_non_finite" in block.statement and "reference gives nan" in block.statement
    assert block.data["reason"]["reason"] == "lost_non_finite"
    assert block.data["reason_count"] == block.data["failed"] == 5
    if flag_is_a_parameter:  # the value the planner can avoid carries them, and is avoided
        assert (carrier["kind"], carrier["name"], carrier["value"]) == ("param", "flags", FAST_MATH)
        assert f"carried by flags={FAST_MATH!r}" in block.statement
        assert pruned(lessons) == [("flags", FAST_MATH)]
        (flags,) = regions(lessons, "flags", FAST_MATH)
        assert "12 of 12 evaluated vs 0 of 30" in flags.statement
        assert "lost_non_finite" in flags.statement and flags.statement.endswith("avoid it")
    else:  # a flag the writer chose: named, and nothing is pruned
        assert (carrier["kind"], carrier["name"]) == ("flag", "-ffast-math")
        assert "carried by flag -ffast-math" in block.statement
        assert pruned(lessons) == []


def test_a_value_that_carries_its_own_failures_is_avoided() -> None:
    campaign = Campaign()
    rng = random.Random(7)
    for _ in range(30):
        tile = rng.choice([16, 32, 64])
        campaign.candidate({"tile": tile, "unroll": rng.choice([1, 2, 4])}, speedup=1.5)
    for index in range(6):
        campaign.candidate(
            {"tile": 128, "unroll": [1, 2, 4][index % 3]},
            rejected=("compile", "spills", f"ptxas: {index} bytes spilled"),
        )
    lessons = draw_lessons(campaign.history, CAMPAIGN)
    assert pruned(lessons) == [("tile", 128)]
    (tile,) = regions(lessons, "tile", 128)
    assert tile.data["carried_by"] is None and tile.data["p_value"] < tile.data["threshold"]
    assert "6 of 6 evaluated vs 0 of 30" in tile.statement
    assert "6 of them at compile (spills): ptxas: N bytes spilled: avoid it" in tile.statement


def test_lessons_recorded_under_the_first_rule_prune_nothing() -> None:
    old = {"template": TEMPLATE, "param": "block", "value": 256, "avoid": True}
    assert lesson_rule(old) == 1 and not prunes(old)
    assert prunes({**old, "rule": 2}) and not prunes({**old, "rule": 2, "avoid": False})
    assert prunes({**old, "rule": 3})  # rule 3 added operator lessons, not a new test
    assert regions_to_avoid([old]) == []


def test_the_planner_avoids_a_region_by_its_latest_lesson() -> None:
    avoid = {"rule": 2, "template": TEMPLATE, "param": "block", "value": 256, "avoid": True}
    carried = {**avoid, "avoid": False, "carried_by": {"kind": "flag", "name": "-ffast-math"}}
    tile = {**avoid, "param": "tile", "value": 128}
    effect = {"rule": 2, "template": TEMPLATE, "param": "block", "value": 256, "n": 3}
    assert regions_to_avoid([avoid, tile, effect]) == [avoid, tile]
    assert regions_to_avoid([avoid, tile, carried, effect]) == [tile]
    assert regions_to_avoid([carried, avoid]) == [avoid]


# --- effects with their sample sizes and interval -----------------------------------------


def test_an_effect_states_both_sample_sizes_and_its_welch_interval() -> None:
    campaign = Campaign()
    # Log speedups 1.0, 1.2, 1.4 with vec=8 and 0.0, 0.2, 0.4 without: equal variances
    # (0.04), so Welch's degrees of freedom are 4 and t(0.975, 4) = 2.776445.
    for vec, logs in ((8, (1.0, 1.2, 1.4)), (4, (0.0, 0.2, 0.4))):
        for x in logs:
            campaign.candidate({"vec": vec}, speedup=math.exp(x))
    lessons = draw_lessons(campaign.history, CAMPAIGN)
    (effect,) = [x for x in lessons if x.kind == "parameter_effect" and x.data["value"] == 8]
    half = 2.776445 * math.sqrt(0.04 / 3 + 0.04 / 3)
    assert effect.data["n"] == 3 and effect.data["n_other"] == 3
    assert effect.data["df"] == pytest.approx(4.0)
    assert effect.data["speedup_ratio"] == pytest.approx(math.e)
    assert effect.data["ci"] == pytest.approx([math.exp(1 - half), math.exp(1 + half)], rel=1e-6)
    assert effect.data["significant"] is True and effect.data["confidence"] == 0.95
    assert effect.statement == (
        "rows: vec=8 gives 2.72x the speedup of other values (95% CI 1.73x-4.28x, n=3 vs 3)"
    )
    assert len(effect.evidence_ids) == 6  # each side's fastest, slowest and first two


def test_an_effect_from_few_noisy_kernels_says_it_is_not_significant() -> None:
    """Issue 35: "prefetch=0 gives 3.63x the speedup of other values (n=3 vs 5)"."""
    campaign = Campaign()
    for prefetch, speedup in [(0, 9.0), (0, 0.9), (0, 4.0), (1, 0.5), (1, 2.0)] + [(2, 1.0)] * 3:
        campaign.candidate({"prefetch": prefetch}, speedup=speedup)
    (effect,) = [
        x
        for x in draw_lessons(campaign.history, CAMPAIGN)
        if x.kind == "parameter_effect" and x.data["value"] == 0
    ]
    low, high = effect.data["ci"]
    assert low < 1 < high and effect.data["significant"] is False
    assert effect.statement.endswith(f"(95% CI {low:.2f}x-{high:.2f}x, n=3 vs 5, not significant)")


# --- bounded evidence on a large history ------------------------------------------------


def large_campaign(candidates: int, generations: int, seed: int = 11) -> Campaign:
    campaign = Campaign()
    rng = random.Random(seed)
    for _ in range(generations):
        campaign.open()
        for _ in range(candidates // generations):
            params = {"tile": rng.choice([16, 32, 64, 128]), "unroll": rng.choice([1, 2, 4, 8])}
            if (params["tile"] == 128 and params["unroll"] == 8) or rng.random() < 0.2:
                stage = rng.choice(["compile", "run", "compare"])
                campaign.candidate(params, rejected=(stage, "mismatch", "element 9 differs"))
            else:
                speed = math.log2(params["tile"]) * 0.3 - 0.1 * params["unroll"]
                campaign.candidate(params, speedup=math.exp(speed + rng.gauss(0, 0.2)))
        campaign.close(lessons_due(campaign.history, CAMPAIGN))
    return campaign


def test_evidence_and_data_stay_bounded_on_a_large_history() -> None:
    campaign = large_campaign(candidates=3000, generations=3)
    lessons = [e for e in campaign.events if isinstance(e, LessonLearned)]
    assert {x.kind for x in lessons} == {"parameter_effect", "failure_signature", "lineage"}
    timed = sum(1 for c in campaign.history.candidates.values() if c.benchmark)
    assert timed > 2000
    for lesson in lessons:
        assert len(lesson.evidence_ids) <= MAX_EVIDENCE, lesson.statement
        assert len(encode(lesson)) < 2_000, lesson.statement
        assert lesson_rule(lesson.data) == RULE
    cited = {i for x in lessons for i in x.evidence_ids}
    assert cited <= {e.event_id for e in campaign.events}
    assert ("tile", 128) in pruned([Lesson(x.kind, x.statement, [], x.data) for x in lessons])


def test_tallies_kept_as_the_history_grows_draw_what_a_fresh_replay_draws() -> None:
    campaign = large_campaign(candidates=600, generations=6, seed=13)
    fresh = History()
    for position, event in enumerate(campaign.events, 1):
        fresh.apply(position, event)
        if isinstance(event, GenerationClosed):
            # A history replayed to here in one go, against the one the campaign drew from
            # generation by generation.
            replayed = History()
            for p, e in enumerate(campaign.events[:position], 1):
                replayed.apply(p, e)
            assert draw_lessons(replayed, CAMPAIGN) == draw_lessons(fresh, CAMPAIGN)


def test_a_kernel_timed_out_of_order_walks_the_lineage_again() -> None:
    campaign = Campaign()
    campaign.candidate({"tile": 16}, speedup=1.0)
    campaign.candidate({"tile": 32}, speedup=3.0)
    draw_lessons(campaign.history, CAMPAIGN)  # the walk so far is kept
    # Timed before the others (a benchmarker whose result arrived late).
    late = campaign.candidate({"tile": 64}, speedup=9.0, timed_at=START - timedelta(days=1))
    campaign.candidate({"tile": 128}, speedup=2.0)
    (chain,) = [x for x in draw_lessons(campaign.history, CAMPAIGN) if x.kind == "lineage"]
    expected = promotions(campaign.history.campaign_candidates(CAMPAIGN))
    assert chain.data["chain"] == [c.candidate_id for c in expected]
    assert chain.data["chain"][0] == late


def test_parameter_effects_of_a_list_of_candidates_are_those_of_the_history() -> None:
    campaign = large_campaign(candidates=400, generations=1, seed=17)
    scope = list(campaign.history.candidates.values())
    drawn = [x for x in draw_lessons(campaign.history, CAMPAIGN) if x.kind == "parameter_effect"]
    assert [x.statement for x in parameter_effects(scope)] == [x.statement for x in drawn]


# --- an old store: lessons under the first rule are not re-derived ----------------------


def rule_one_lessons(campaign: Campaign) -> list[Lesson]:
    """Lessons as the first rule recorded them: every timed kernel cited, no `rule`, and
    a value avoided once its 2 kernels failed."""
    timed = [c for c in campaign.history.candidates.values() if c.benchmark]
    every = [c.benchmark.event_id for c in timed if c.benchmark]
    failed = [c.rejected.event_id for c in campaign.history.candidates.values() if c.rejected]
    return [
        Lesson(
            "parameter_effect",
            "rows: block=64 gives 2.00x the speedup of other values (effect size +1.00, "
            f"n={len(timed) // 2} vs {len(timed) - len(timed) // 2})",
            every,
            {"template": TEMPLATE, "param": "block", "value": 64, "effect_size": 1.0, "n": 2},
        ),
        Lesson(
            "failure_signature",
            "rows: every candidate with block=256 failed (compare; n=2): avoid it",
            failed,
            {"template": TEMPLATE, "param": "block", "value": 256, "avoid": True},
        ),
    ]


def old_then_new(home: Path) -> Campaign:
    """Two generations recorded before lessons had a rule version, then two after."""
    campaign = Campaign()
    for generation in range(4):
        campaign.open()
        for block in (64, 128, 64, 128):
            campaign.candidate({"block": block}, speedup=2.0 if block == 64 else 1.0 + generation)
        campaign.candidate({"block": 256}, rejected=("compare", "mismatch", "element 3 differs"))
        if generation < 2:
            campaign.close(rule_one_lessons(campaign))
        else:
            campaign.close(lessons_due(campaign.history, CAMPAIGN))
    store = DuckDBEventStore(home / "events.duckdb")
    store.append([Recorded(e, encode(e)) for e in campaign.events])
    store.close()
    return campaign


def test_an_old_store_still_audits_and_says_what_it_did_not_rederive(tmp_path: Path) -> None:
    """The generations of the current rule are re-derived and agree; those recorded
    under the first rule are not this code's to draw, and the audit says it skipped them
    rather than claiming they agree."""
    campaign = old_then_new(tmp_path)
    told = [e for e in campaign.events if isinstance(e, LessonLearned)]
    assert {lesson_rule(x.data) for x in told if x.generation < 2} == {1}
    assert {lesson_rule(x.data) for x in told if x.generation >= 2} == {RULE}
    done = kfactory("audit", CAMPAIGN, "--home", str(tmp_path), "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0, report
    claims = {c["status"]: c for c in report["claims"] if c["name"] == "lessons"}
    assert set(claims) == {"agrees", "skipped"}
    assert claims["agrees"]["evidence"] == "2 generations' lessons re-derived, all equal"
    assert claims["skipped"]["evidence"].startswith(
        "2 generation(s) recorded under rule v1 (generations 0-1), not re-derived"
    )


def test_a_lesson_of_the_current_rule_that_does_not_reproduce_still_differs(
    tmp_path: Path,
) -> None:
    campaign = old_then_new(tmp_path)
    forged = [
        (position, e)
        for position, e in enumerate(campaign.events, 1)
        if not (isinstance(e, LessonLearned) and e.generation == 3 and e.kind == "lineage")
    ]
    claims = [c for c in audit_projections(forged, CAMPAIGN) if c.name == "lessons"]
    assert [c.status for c in claims] == ["differs", "skipped"]  # the rule-1 generations
    assert "generation 3: re-derived but not recorded" in claims[0].evidence
    # An old rule's lessons after the current rule's are not passed over either.
    old = [x for x in campaign.events if isinstance(x, LessonLearned) and x.generation == 0]
    moved = [
        (position, msgspec.structs.replace(e, generation=3) if e in old else e)
        for position, e in enumerate(campaign.events, 1)
    ]
    claims = [c for c in audit_projections(moved, CAMPAIGN) if c.name == "lessons"]
    assert any(f"lessons under rules [1, {RULE}]" in c.evidence for c in claims), claims
