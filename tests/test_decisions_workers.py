"""The kernel writer's, verifier's and benchmarker's decisions, driven from a recorded
campaign's events: no bus, no compiler, no device (simulation from a recorded log, the
way Kernel Tuner tests its strategies from a recorded cache)."""

from __future__ import annotations

from typing import TypeVar

import msgspec
import pytest

from actors.campaign.history import History
from actors.roles.benchmarker import TimedWindow, decide_timed, timing_job
from actors.roles.kernel_writer import (
    Kernel,
    decide_fusion,
    decide_reply,
    decide_template,
    decide_written,
    variation_prompt,
)
from actors.roles.verifier import decide_verdict
from actors.runtime import PoisonMessage, Reactions
from actors.search.variation import LLM_TEMPLATE
from eventstore.events import (
    ActorRef,
    BenchmarkCompleted,
    CandidateDeduplicated,
    CandidateProposed,
    Event,
    FusionPlanned,
    KernelRejected,
    KernelVerified,
    KernelWritten,
    new_event,
)
from eventstore.ids import new_event_id
from gpu_workers.results import (
    BenchmarkResult,
    HeadToHead,
    Mechanism,
    Rejection,
    SandboxReport,
    TimingStats,
    Verdict,
)
from kernels.builtin import BUILTIN
from kernels.fusion.plan import plan as fusion_plan
from kernels.identity import source_hash
from kernels.templates import TEMPLATES
from tests.recorded_campaign import TWO_GENERATIONS, history_of, load_log

WRITER = ActorRef(role="kernel-writer", instance="kernel-writer-t", host="test")
VERIFIER = ActorRef(role="verifier", instance="verifier-t", host="test")
BENCHMARKER = ActorRef(role="benchmarker", instance="benchmarker-t", host="test")
LOG = load_log(TWO_GENERATIONS)
FUSED = BUILTIN["residual_rmsnorm_gelu"]
E = TypeVar("E", bound=Event)


def recorded(kind: type[E]) -> list[E]:
    return [e for e in LOG if isinstance(e, kind)]


def answer_to(kind: type[E], candidate_id: str) -> E:
    return next(e for e in recorded(kind) if getattr(e, "candidate_id", None) == candidate_id)


def payload(event: Event) -> dict[str, object]:
    """What an event says, without when it was said and by which instance."""
    fields = msgspec.to_builtins(event)
    for envelope in ("ts", "actor"):
        fields.pop(envelope)
    return fields


def proposal_like(
    original: CandidateProposed, candidate_id: str, **changes: object
) -> CandidateProposed:
    """A new proposal in the same campaign, as the planner would record it."""
    return msgspec.structs.replace(
        original, event_id=new_event_id(), candidate_id=candidate_id, **changes
    )


def with_events(history: History, *events: Event) -> History:
    for event in events:
        history.apply(history.position + 1, event)
    return history


# --- the kernel writer ---------------------------------------------------------------------


def test_every_recorded_proposal_is_written_again_as_it_was_recorded() -> None:
    """Replaying each proposal against the history the writer saw gives the recorded
    KernelWritten: same id (so the store would deduplicate it), same kernel identity."""
    proposals = recorded(CandidateProposed)
    assert len(proposals) == 6
    for proposal in proposals:
        out = Reactions(proposal, WRITER)
        decide_template(
            history_of(LOG, proposal.event_id), proposal, out, TEMPLATES.get(proposal.template)
        )
        [written] = out.events
        expected = answer_to(KernelWritten, proposal.candidate_id)
        assert isinstance(written, KernelWritten)
        assert written.event_id == expected.event_id
        assert (written.template, written.params, written.param_key) == (
            expected.template,
            expected.params,
            expected.param_key,
        )
        assert written.source_hash == source_hash(written.source, written.flags)


def written_today(first: CandidateProposed) -> tuple[list[Event], KernelWritten]:
    """The log with `first`'s kernel as today's templates write it, and that event. The
    log keeps the sources of the templates it was recorded with; the writer's duplicate
    check compares the source it renders now."""
    out = Reactions(first, WRITER)
    decide_template(history_of(LOG, first.event_id), first, out, TEMPLATES.get(first.template))
    [today] = out.events
    assert isinstance(today, KernelWritten)
    recorded_one = answer_to(KernelWritten, first.candidate_id)
    return [today if e is recorded_one else e for e in LOG], today


def test_a_settled_source_proposed_again_is_deduplicated_against_its_outcome() -> None:
    first = recorded(CandidateProposed)[0]
    log, written = written_today(first)
    again = proposal_like(first, "recorded-softmax:g9:c0")
    history = with_events(history_of(log), again)
    out = Reactions(again, WRITER)
    decide_template(history, again, out, TEMPLATES.get(again.template))
    [dedupe] = out.events
    timed = answer_to(BenchmarkCompleted, first.candidate_id)
    assert isinstance(dedupe, CandidateDeduplicated)
    assert dedupe.duplicate_of == timed.event_id
    assert dedupe.candidate_id == "recorded-softmax:g9:c0"
    assert dedupe.source_hash == written.source_hash
    assert dedupe.param_key == first.param_key


def test_a_source_still_in_flight_is_no_duplicate_yet() -> None:
    first = recorded(CandidateProposed)[0]
    log, written = written_today(first)
    again = proposal_like(first, "recorded-softmax:g9:c1")
    history = with_events(history_of(log, written.event_id), again)  # not yet timed
    out = Reactions(again, WRITER)
    decide_template(history, again, out, TEMPLATES.get(again.template))
    [event] = out.events
    assert isinstance(event, KernelWritten) and event.source_hash == written.source_hash


def test_a_redelivered_proposal_is_never_a_duplicate_of_itself() -> None:
    first = recorded(CandidateProposed)[0]
    out = Reactions(first, WRITER)
    decide_template(
        history_of(LOG), first, out, TEMPLATES.get(first.template)
    )  # its own outcome is in the history
    [event] = out.events
    assert isinstance(event, KernelWritten)
    assert event.event_id == answer_to(KernelWritten, first.candidate_id).event_id


def test_any_writer_s_kernel_with_a_settled_source_is_deduplicated() -> None:
    """The LLM's kernel, identical to a template's timed one, is not evaluated again."""
    parent = recorded(KernelWritten)[2]
    variation = proposal_like(
        recorded(CandidateProposed)[0],
        "recorded-softmax:g9:c2",
        template=LLM_TEMPLATE,
        params={},
        param_key="",
        operator="improve",
        parents=[parent.candidate_id],
    )
    history = with_events(history_of(LOG), variation)
    out = Reactions(variation, WRITER)
    decide_written(history, variation, out, Kernel(parent.source, parent.flags, "llm"))
    [event] = out.events
    assert isinstance(event, CandidateDeduplicated)
    assert event.duplicate_of == answer_to(BenchmarkCompleted, parent.candidate_id).event_id


def test_parameters_the_template_refuses_are_a_poison_message_that_says_why() -> None:
    bad = proposal_like(recorded(CandidateProposed)[0], "recorded-softmax:g9:c3", params={})
    with pytest.raises(PoisonMessage, match=r"\w"):
        decide_template(
            with_events(history_of(LOG), bad), bad, Reactions(bad, WRITER), TEMPLATES[bad.template]
        )


def test_a_proposal_of_a_campaign_never_started_is_refused() -> None:
    stray = proposal_like(recorded(CandidateProposed)[0], "nowhere:g0:c0", campaign_id="nowhere")
    with pytest.raises(PoisonMessage, match="campaign nowhere of nowhere:g0:c0 is not recorded"):
        decide_template(history_of(LOG), stray, Reactions(stray, WRITER), TEMPLATES[stray.template])


def fusion_planned(groups: list[list[str]], candidate_id: str) -> FusionPlanned:
    proposal = recorded(CandidateProposed)[0]
    fused = fusion_plan(FUSED, "add+rmsnorm|gelu", {"unroll": 2})
    return new_event(
        FusionPlanned,
        campaign_id=proposal.campaign_id,
        actor=ActorRef(role="fuser", instance="fuser-t", host="test"),
        cause=proposal,
        problem=FUSED.name,
        target="cpu",
        candidate_id=candidate_id,
        generation=9,
        groups=groups,
        params=dict(fused.params),
        param_key=fused.param_key,
    )


def test_a_fusion_plan_is_written_as_the_fused_kernel_it_describes() -> None:
    planned = fusion_planned([["add", "rmsnorm"], ["gelu"]], "recorded-softmax:g9:c5")
    out = Reactions(planned, WRITER)
    decide_fusion(history_of(LOG), planned, out)
    [written] = out.events
    expected = fusion_plan(FUSED, "add+rmsnorm|gelu", {"unroll": 2})
    assert isinstance(written, KernelWritten)
    assert (written.writer, written.template, written.source) == (
        "fuser",
        "fusion",
        expected.source,
    )
    assert (written.params, written.param_key) == (planned.params, planned.param_key)


def test_a_fusion_plan_its_space_refuses_is_a_poison_message() -> None:
    planned = fusion_planned([["add"], ["rmsnorm", "gelu"]], "recorded-softmax:g9:c6")
    with pytest.raises(PoisonMessage, match=r"\w"):
        decide_fusion(history_of(LOG), planned, Reactions(planned, WRITER))


def llm_variation(operator: str, parents: list[str]) -> CandidateProposed:
    return proposal_like(
        recorded(CandidateProposed)[0],
        "recorded-softmax:g9:c4",
        template=LLM_TEMPLATE,
        params={},
        param_key="",
        operator=operator,
        parents=parents,
    )


def test_the_llm_s_reply_is_rejected_when_absent_or_without_code() -> None:
    variation = llm_variation("improve", [recorded(KernelWritten)[0].candidate_id])
    history = with_events(history_of(LOG), variation)
    silent, chatty = Reactions(variation, WRITER), Reactions(variation, WRITER)
    decide_reply(history, variation, silent, None, BUILTIN["softmax"])
    decide_reply(
        history, variation, chatty, "I would rather not write C today.", BUILTIN["softmax"]
    )
    [failed], [empty] = silent.events, chatty.events
    assert isinstance(failed, KernelRejected) and isinstance(empty, KernelRejected)
    assert (failed.stage, failed.reason) == ("write", "llm_failed")
    assert "LlmExchanged" in failed.evidence["message"]
    assert (empty.stage, empty.reason) == ("write", "no_code")
    assert empty.evidence["message"]
    assert failed.candidate_id == empty.candidate_id == "recorded-softmax:g9:c4"


def test_the_kernel_in_a_reply_is_written_with_the_flags_it_asks_for() -> None:
    parent = recorded(KernelWritten)[0]
    variation = llm_variation("improve", [parent.candidate_id])
    history = with_events(history_of(LOG), variation)
    changed = parent.source.replace("{", "{ /* improved */", 1)
    reply = f"Here it is:\n```c\n// kfactory-flags: -O2 -ffast-math\n{changed}```\n"
    out = Reactions(variation, WRITER)
    decide_reply(history, variation, out, reply, BUILTIN["softmax"])
    [written] = out.events
    assert isinstance(written, KernelWritten)
    assert (written.writer, written.flags, written.template) == (
        "llm",
        ["-O2", "-ffast-math"],
        LLM_TEMPLATE,
    )
    assert "/* improved */" in written.source


def test_an_improvement_is_asked_with_the_parent_s_source_and_the_lessons() -> None:
    parent = recorded(KernelWritten)[1]
    variation = llm_variation("improve", [parent.candidate_id])
    history = with_events(history_of(LOG), variation)
    lesson = recorded_lesson()
    messages = variation_prompt(history, variation, BUILTIN["softmax"], [lesson])
    text = "\n".join(m["content"] for m in messages)
    assert parent.source.strip() in text
    assert lesson in text


def recorded_lesson() -> str:
    from eventstore.events import LessonLearned

    return recorded(LessonLearned)[0].statement


def test_a_fix_is_asked_with_the_parent_s_rejection_evidence() -> None:
    """The benchmarker refuses a recorded kernel; the writer's fix quotes why."""
    parent = recorded(KernelVerified)[0]
    refused = Reactions(parent, BENCHMARKER)
    stall = Rejection(
        stage="benchmark",
        reason="timing_stall",
        message="call 0 took 190 ms, the median 1 ms",
        evidence={"call": "0"},
    )
    decide_timed(parent, refused, stall, device="test", incumbent=None)
    variation = llm_variation("fix", [parent.candidate_id])
    history = with_events(history_of(LOG, parent.event_id), *refused.events, variation)
    messages = variation_prompt(history, variation, BUILTIN["softmax"], [])
    text = "\n".join(m["content"] for m in messages)
    assert "timing_stall" in text and "call 0 took 190 ms, the median 1 ms" in text


def test_a_variation_of_a_parent_with_no_kernel_is_refused() -> None:
    variation = llm_variation("improve", ["recorded-softmax:g0:nobody"])
    with pytest.raises(PoisonMessage, match="no recorded kernel"):
        variation_prompt(with_events(history_of(LOG), variation), variation, BUILTIN["softmax"], [])


# --- the verifier ---------------------------------------------------------------------------


def test_a_passed_check_is_the_recorded_kernel_verified() -> None:
    for written in recorded(KernelWritten):
        expected = answer_to(KernelVerified, written.candidate_id)
        verdict = Verdict(
            problem=written.problem,
            target=written.target,
            dtype=written.dtype,
            source_sha256="",
            flags=tuple(written.flags),
            verified=True,
            trials=(),
            max_rel_err=expected.max_rel_err,
            compile_cache_hit=bool(expected.evidence["compile_cache_hit"]),
            seed=expected.seed,
        )
        out = Reactions(written, VERIFIER)
        decide_verdict(written, out, verdict)
        [verified] = out.events
        assert isinstance(verified, KernelVerified)
        same = {**payload(expected), "trials": 0}
        assert payload(verified) == same


def test_a_failed_check_is_a_rejection_with_its_stage_reason_message_and_seed() -> None:
    written = recorded(KernelWritten)[0]
    wrong = Rejection(
        stage="compare",
        reason="wrong_value",
        message="out[3, 17] is 0.5, expected 0.25",
        evidence={"index": "3, 17"},
    )
    verdict = Verdict(
        problem="softmax",
        target="cpu",
        dtype="fp32",
        source_sha256="",
        flags=(),
        verified=False,
        rejection=wrong,
        seed=42,
    )
    out = Reactions(written, VERIFIER)
    decide_verdict(written, out, verdict)
    [rejected] = out.events
    assert isinstance(rejected, KernelRejected)
    assert (rejected.stage, rejected.reason, rejected.seed) == ("compare", "wrong_value", 42)
    assert rejected.evidence == {"message": "out[3, 17] is 0.5, expected 0.25", "index": "3, 17"}
    assert (rejected.candidate_id, rejected.source_hash) == (
        written.candidate_id,
        written.source_hash,
    )


# --- the benchmarker ----------------------------------------------------------------------


def test_each_verified_kernel_is_timed_with_its_recorded_source_at_the_campaign_s_shape() -> None:
    for verified in recorded(KernelVerified):
        job = timing_job(history_of(LOG, verified.event_id), verified, ("rows", "cols"))
        written = answer_to(KernelWritten, verified.candidate_id)
        assert job is not None
        assert (job.source, job.flags) == (written.source, tuple(written.flags))
        assert job.shape == {"rows": 256, "cols": 1024}


def test_the_incumbent_is_the_campaign_s_best_when_the_kernel_is_timed() -> None:
    """As recorded: the first kernel is timed alone, every later one against the best the
    history held when its timing started (a kernel verified before the best was timed
    still meets it: the benchmarker reads the history again once its window opens)."""
    incumbents = []
    for index, timed in enumerate(LOG):
        if not isinstance(timed, BenchmarkCompleted):
            continue
        verified = answer_to(KernelVerified, timed.candidate_id)
        job = timing_job(history_of(LOG, LOG[index - 1].event_id), verified, ("rows", "cols"))
        assert job is not None
        incumbent = job.incumbent.candidate_id if job.incumbent else None
        assert incumbent == timed.incumbent
        if job.incumbent is not None:
            best = answer_to(KernelWritten, job.incumbent.candidate_id)
            assert (job.incumbent.source, job.incumbent.flags) == (best.source, tuple(best.flags))
        incumbents.append(incumbent)
    assert incumbents[0] is None and None not in incumbents[1:], incumbents


def test_a_redelivered_kernel_that_has_its_outcome_is_not_timed_again() -> None:
    verified = recorded(KernelVerified)[0]
    timed = answer_to(BenchmarkCompleted, verified.candidate_id)
    assert timing_job(history_of(LOG, timed.event_id), verified, ("rows", "cols")) is None


def test_a_verified_kernel_the_history_has_no_source_for_is_refused() -> None:
    stray = msgspec.structs.replace(recorded(KernelVerified)[0], candidate_id="c-unknown")
    with pytest.raises(PoisonMessage, match="no recorded kernel for c-unknown"):
        timing_job(history_of(LOG), stray, ("rows", "cols"))


def replayed_result(timed: BenchmarkCompleted) -> BenchmarkResult:
    """The timing outcome the recorded BenchmarkCompleted was made from."""
    evidence = timed.evidence
    assert timed.q1_ns is not None and timed.q3_ns is not None and timed.samples is not None
    assert timed.roofline_ns is not None and timed.baseline_iqr_ns is not None
    assert timed.timing_attempts is not None
    stats = TimingStats(
        mean_ns=timed.time_ns,
        median_ns=timed.median_ns,
        q1_ns=timed.q1_ns,
        q3_ns=timed.q3_ns,
        iqr_ns=timed.iqr_ns,
        min_ns=timed.median_ns,
        max_ns=timed.median_ns,
        runs=timed.samples,
    )
    baseline = msgspec.structs.replace(
        stats,
        mean_ns=timed.baseline_time_ns,
        median_ns=timed.baseline_ns,
        iqr_ns=timed.baseline_iqr_ns,
    )
    return BenchmarkResult(
        problem=timed.problem,
        target=timed.target,
        shape=timed.shape,
        kernel=stats,
        baseline=baseline,
        baseline_name=timed.baseline,
        incumbent=None,
        speedup=timed.speedup,
        speedup_vs_incumbent=timed.speedup_vs_incumbent,
        roofline_ns=timed.roofline_ns,
        roofline_fraction=timed.roofline_fraction,
        input_sets=2,
        rotated_bytes=0,
        timed_seconds=1.0,
        seed=timed.seed,
        judged_calls=tuple(evidence["judged_calls"]),
        rechecked=tuple(evidence["rechecked"]),
        handshake_ns=evidence["handshake_ns"],
        host_contention_cores=timed.host_contention_cores,
        timing_attempts=timed.timing_attempts,
        head_to_head=msgspec.convert(msgspec.to_builtins(timed.head_to_head), HeadToHead | None),
        sandbox=SandboxReport(
            network_isolated=True,
            network_note="",
            cpu_seconds_limit=1,
            address_space_limit_bytes=1,
            wall_seconds_limit=1.0,
            mechanisms=(
                *(Mechanism(name=m, applied=True, note="") for m in evidence["contained_by"]),
                Mechanism(name="not_applied_here", applied=False, note="left out"),
            ),
        ),
    )


def test_each_recorded_timing_becomes_the_recorded_benchmark_completed() -> None:
    for verified in recorded(KernelVerified):
        expected = answer_to(BenchmarkCompleted, verified.candidate_id)
        out = Reactions(verified, BENCHMARKER)
        decide_timed(
            verified,
            out,
            replayed_result(expected),
            device=expected.device,
            incumbent=expected.incumbent,
            window=msgspec.convert(expected.evidence["lease"], TimedWindow),
        )
        [timed] = out.events
        assert isinstance(timed, BenchmarkCompleted)
        # recorded before the means were kept, where the median was the time: they are now
        now = msgspec.structs.replace(
            expected, mean_ns=expected.time_ns, baseline_mean_ns=expected.baseline_time_ns
        )
        assert payload(timed) == payload(now)


@pytest.mark.parametrize(
    ("stage", "reason", "message", "evidence"),
    [
        ("compile", "compile_error", "kernel.c:4:5: error: 'y' undeclared", {"log": "kernel.c:4"}),
        ("benchmark", "timing_stall", "call 0 stalled", {"call": "0"}),
        ("recheck", "unwritten", "out was never written", {"distribution": "ties"}),
        ("roofline", "beyond_roofline", "faster than memory allows", {"fraction": "3.1"}),
    ],
)
def test_a_refused_timing_is_a_rejection_with_its_stage_reason_and_message(
    stage: str, reason: str, message: str, evidence: dict[str, str]
) -> None:
    verified = recorded(KernelVerified)[1]
    out = Reactions(verified, BENCHMARKER)
    refused = Rejection(stage=stage, reason=reason, message=message, evidence=evidence)  # type: ignore[arg-type]
    decide_timed(verified, out, refused, device="test", incumbent=None)
    [rejected] = out.events
    assert isinstance(rejected, KernelRejected)
    assert (rejected.stage, rejected.reason) == (stage, reason)
    assert rejected.evidence == {"message": message, **evidence}
    assert (rejected.candidate_id, rejected.source_hash, rejected.generation) == (
        verified.candidate_id,
        verified.source_hash,
        verified.generation,
    )
    assert rejected.causation_id == verified.event_id
