"""The evolve strategy and the kernel writer's operators, decided from a history written
by hand (tests/evolve_history.py): generation 0 is the seed as it is; later generations
vary the best timed kernels with the operator a bandit picks, at points drawn from the
campaign's seed, never proposing a (parent source, operator, params) twice; the writer
applies a proposal to its recorded parents, the same child on every delivery, and records
a refusal as the write stage's rejection with the operator named."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest

from actors.campaign.campaign_file import CampaignError, validate
from actors.campaign.history import History
from actors.records.best_kernels import kernel_text
from actors.roles.kernel_writer import MAX_DIFF_CHARS, bounded_diff, decide_operator
from actors.runtime import Reactions
from actors.search.evolve_strategy import EvolveStrategy
from actors.search.lineage import (
    EVOLVE_TEMPLATE,
    context_for,
    lineage_of,
    parent_kernel,
    template_point_of,
)
from actors.search.operator_bandit import (
    PREFERENCE,
    PRIOR_WEIGHT,
    REJECTED_PENALTY,
    Bandit,
    family_prior,
    reward,
)
from actors.search.operators.protocol import ParentKernel, Refusal
from actors.search.operators.registry import OPERATORS
from actors.search.strategy import Filled, GenerationInputs, Planned, Stalled
from eventstore.events import (
    CandidateProposed,
    GenerationClosed,
    GenerationOpened,
    KernelRejected,
    KernelWritten,
)
from kernels.templates import TEMPLATES
from ops.progress import Progress
from tests.evolve_history import ACTOR, CAMPAIGN, ROWFLIP, VECSCALE, Log
from tests.evolve_recording import record_campaign

FIRST_OFFLINE = next(n for n in PREFERENCE if n in OPERATORS)
"""The first untried arm without an endpoint (the agent is first where there is one)."""


def test_generation_0_is_the_seed_as_it_is_and_nothing_to_start_from_stalls(
    tmp_path: Path,
) -> None:
    log = Log(tmp_path)
    first = log.fill(0)
    assert isinstance(first, Filled) and len(first.candidates) == 1
    assert first.candidates[0].template.startswith("seed")
    campaign = log.history.campaigns[CAMPAIGN]
    empty = GenerationInputs(4, [], [], frozenset(), [])
    stalled = EvolveStrategy().fill(log.history, campaign, 0, empty)
    assert isinstance(stalled, Stalled) and stalled.kind == "no_seed"


def test_later_generations_vary_the_best_kernel_with_the_bandits_operators(tmp_path: Path) -> None:
    log = Log(tmp_path)
    seed = log.timed_seed()
    filled = log.fill(1)
    assert isinstance(filled, Filled) and len(filled.candidates) == 4
    assert all(p.template == EVOLVE_TEMPLATE and p.parents == [seed] for p in filled.candidates)
    operators = [p.operator for p in filled.candidates]
    # untried arms first, in the preferred order; no endpoint: no agent
    assert operators[0] == FIRST_OFFLINE
    assert "agent" not in operators
    assert len(set(operators)) == 4  # a slot chosen counts as a pull: the slots spread
    assert len({p.param_key for p in filled.candidates}) == 4
    assert log.fill(1) == filled  # a pure function of the history


def test_a_written_child_records_its_operator_parents_and_diff_the_same_on_redelivery(
    tmp_path: Path,
) -> None:
    log = Log(tmp_path)
    seed = log.timed_seed()
    filled = log.fill(1)
    assert isinstance(filled, Filled)
    proposals = log.propose(1, filled.candidates)
    again = Reactions(proposals[0], ACTOR)
    decide_operator(log.history, proposals[0], again, context_for(log.spec))
    (written,) = log.write(proposals[0])
    assert isinstance(written, KernelWritten)
    assert (written.writer, written.operator, written.parents) == (
        "operator",
        proposals[0].operator,
        [seed],
    )
    assert written.diff.startswith("---") and "+" in written.diff
    assert again.events[0].source_hash == written.source_hash  # type: ignore[attr-defined]
    child = log.history.candidates[proposals[0].candidate_id]
    assert [s.operator for s in lineage_of(log.history, child)] == [proposals[0].operator]


def test_a_refusal_is_the_write_stages_rejection_naming_the_operator(tmp_path: Path) -> None:
    log = Log(tmp_path)
    seed = log.timed_seed()
    log.add(GenerationOpened, generation=1, planned=1)
    proposal = log.add(  # the seed calls no libm function: approx_math has nothing to do
        CandidateProposed,
        template=EVOLVE_TEMPLATE,
        params={},
        param_key="k",
        operator="approx_math",
        parents=[seed],
        **log.work(f"{CAMPAIGN}:g1:c0", 1),
    )
    (rejected,) = log.write(proposal)
    assert isinstance(rejected, KernelRejected) and rejected.stage == "write"
    assert rejected.evidence["operator"] == "approx_math" and rejected.evidence["message"]
    assert reward(log.history, log.history.candidates[proposal.candidate_id]) == 0.0


def test_the_bandit_pays_log_speedups_penalises_rejections_and_never_repeats_a_key(
    tmp_path: Path,
) -> None:
    log = Log(tmp_path)
    log.timed_seed(median_ns=40_000.0)
    filled = log.fill(1)
    assert isinstance(filled, Filled)
    proposals = log.propose(1, filled.candidates)
    for proposal in proposals:
        log.write(proposal)
    fast, slow, broken = proposals[0], proposals[1], proposals[2]
    log.timed(fast.candidate_id, 1, 10_000.0)
    log.timed(slow.candidate_id, 1, 80_000.0)
    digest = log.history.candidates[broken.candidate_id].written.source_hash  # type: ignore[union-attr]
    log.add(
        KernelRejected,
        source_hash=digest,
        stage="run",
        reason="wrong_result",
        **log.work(broken.candidate_id, 1),
    )
    log.add(GenerationClosed, generation=1, settled=4, evaluated=4)
    history = log.history
    assert reward(history, history.candidates[fast.candidate_id]) == pytest.approx(math.log(4))
    assert reward(history, history.candidates[slow.candidate_id]) == pytest.approx(math.log(0.5))
    assert reward(history, history.candidates[broken.candidate_id]) == REJECTED_PENALTY
    scope = list(history.candidates.values())
    arms = Bandit.of(history, scope, list(OPERATORS)).summary()
    assert arms[fast.operator] == (1, pytest.approx(math.log(4)))
    second = log.fill(2, count=8)
    assert isinstance(second, Filled) and second.candidates
    earlier = {c.proposal.param_key for c in scope}
    assert not earlier & {p.param_key for p in second.candidates}
    assert fast.candidate_id in {p.parents[0] for p in second.candidates}  # the best is varied
    crossings = [p for p in second.candidates if p.operator == "crossover"]
    assert all(len(set(p.parents)) == 2 for p in crossings)


def test_evolve_takes_c_targets_only_and_a_diff_is_bounded(tmp_path: Path) -> None:
    log = Log(tmp_path)
    with pytest.raises(CampaignError, match="evolve"):
        validate(msgspec.structs.replace(log.spec, target="cuda"))
    long = "+x\n" * MAX_DIFF_CHARS
    assert len(bounded_diff(long)) < MAX_DIFF_CHARS + 100
    assert bounded_diff("+x\n") == "+x\n"


def test_progress_and_the_best_file_name_the_operators_behind_the_best(tmp_path: Path) -> None:
    log = Log(tmp_path)
    log.timed_seed(median_ns=40_000.0)
    filled = log.fill(1, count=1)
    assert isinstance(filled, Filled)
    (proposal,) = log.propose(1, filled.candidates)
    log.write(proposal)
    log.timed(proposal.candidate_id, 1, 10_000.0)
    best = Progress(log.history, CAMPAIGN).counts()
    assert best.best_by == f"{proposal.operator} of g0:c0"
    assert best.best.endswith(f"by {proposal.operator} of g0:c0")
    child = log.history.candidates[proposal.candidate_id]
    text = kernel_text(child, lineage_of(log.history, child))
    assert f"//   1. {proposal.operator}(" in text
    assert "// verified on: the problem states no envelope\n" in text  # a user's problem
    assert text.startswith("// kfactory-flags:") and text.endswith(child.written.source)  # type: ignore[union-attr]


def test_a_campaign_at_another_shape_starts_from_what_paid_and_may_time_the_same_edit(
    tmp_path: Path,
) -> None:
    first = Log(tmp_path)
    first.timed_seed(median_ns=40_000.0)
    filled = first.fill(1, count=1)
    assert isinstance(filled, Filled)
    (child,) = first.propose(1, filled.candidates)
    first.write(child)
    first.timed(child.candidate_id, 1, 10_000.0)  # it paid: log 4
    second = first.then("evolve-wide", (128, 1024))
    second.timed_seed(median_ns=80_000.0)
    again = second.fill(1, count=2)
    assert isinstance(again, Filled)
    # the same edit of the same seed, worth timing at the new shape: its key is not taken
    assert again.candidates[0].param_key == child.param_key
    arms = Bandit.of(second.history, list(second.history.candidates.values()), list(OPERATORS))
    assert arms.summary()[child.operator] == (1, pytest.approx(math.log(4)))


def test_templates_are_one_operator_among_the_others(tmp_path: Path) -> None:
    """A template kernel's point moves one step at a time, and renders again, through the
    writer; a source edit of it leaves the space, so its child has no point."""
    log = Log(tmp_path)
    template = TEMPLATES["softmax_rows"]
    root = f"{CAMPAIGN}:g0:c0"
    log.add(GenerationOpened, generation=0, planned=1)
    point = dict(template.best_known)
    log.add(
        CandidateProposed,
        template=template.name,
        params=point,
        param_key="t",
        **log.work(root, 0),
    )
    rendered = template.render(point)
    log.written(root, 0, rendered.source, list(rendered.flags))
    log.timed(root, 0, 30_000.0)
    log.add(GenerationClosed, generation=0, settled=1, evaluated=1)
    names = sorted(template.space())
    k = next(i for i, n in enumerate(names) if template.space()[n].index(point[n]) > 0)
    step = Planned(EVOLVE_TEMPLATE, {"parameter": k, "step": -1}, "k1", "template", [root])
    edit = Planned(EVOLVE_TEMPLATE, {"restrict": True, "align": 64}, "k2", "restrict", [root])
    moved_p, edited_p = log.propose(1, [step, edit])
    written = log.write(moved_p)[0]
    assert isinstance(written, KernelWritten) and written.operator == "template"
    choices = template.space()[names[k]]
    expected = {**point, names[k]: choices[choices.index(point[names[k]]) - 1]}
    assert written.source == template.render(expected).source
    child = log.history.candidates[moved_p.candidate_id]
    assert template_point_of(log.history, child) == (template.name, tuple(sorted(expected.items())))
    assert isinstance(log.write(edited_p)[0], KernelWritten)
    assert template_point_of(log.history, log.history.candidates[edited_p.candidate_id]) is None
    seed = OPERATORS["template"].apply([parent_kernel_of(log, edited_p)], {}, context_for(log.spec))
    assert isinstance(seed, Refusal) and seed.reason == "no_template"
    edge = {"parameter": k, "step": -1}
    bottom = parent_kernel_of(log, moved_p)
    while True:  # walk down that parameter's choices to the end
        out = OPERATORS["template"].apply([bottom], edge, context_for(log.spec))
        if isinstance(out, Refusal):
            break
        bottom = out.as_parent("next")
    assert out.reason in ("edge", "invalid_point")


def parent_kernel_of(log: Log, proposal: CandidateProposed) -> ParentKernel:
    kernel = parent_kernel(log.history, log.history.candidates[proposal.candidate_id])
    assert kernel is not None
    return kernel


# --- the family's record: a new problem of a family already searched starts from it -----


def earned(history: History, problem: str) -> dict[str, float]:
    """Each operator's mean reward over the problem's operator children."""
    rewards: dict[str, list[float]] = {}
    for child in history.scope_candidates(problem, "cpu", "fp32"):
        paid = reward(history, child) if child.proposal.template == EVOLVE_TEMPLATE else None
        if paid is not None:
            rewards.setdefault(child.proposal.operator, []).append(paid)
    return {name: sum(paid) / len(paid) for name, paid in rewards.items()}


def test_a_new_problem_of_the_family_starts_from_what_paid_on_the_first(tmp_path: Path) -> None:
    first = record_campaign(tmp_path)
    record = earned(first.history, first.spec.problem)
    flip = first.then("flip", (64, 512), ROWFLIP)  # another row-wise operation
    flip.timed_seed()
    filled = flip.fill(1)
    assert isinstance(filled, Filled)
    operators = [p.operator for p in filled.candidates]
    (tmp_path / "alone").mkdir()
    alone = Log(tmp_path / "alone", name="flip", problem_files=ROWFLIP)  # nothing searched
    alone.timed_seed()
    default = alone.fill(1)
    assert isinstance(default, Filled)
    assert default.candidates[0].operator == FIRST_OFFLINE
    # The first slots go to what earned most on the first problem, best first; what was
    # rejected there every time comes after what was never tried.
    best = sorted((name for name in record if record[name] > 0), key=lambda n: -record[n])
    assert operators[:3] == best[:3] and operators != [p.operator for p in default.candidates]
    assert not {n for n in record if record[n] == REJECTED_PENALTY} & set(operators)
    prior = family_prior(flip.history, flip.spec.problem, "cpu", "fp32")
    assert set(prior) == set(record) and all(p.pulls > 0 for p in prior.values())
    assert flip.fill(1) == filled  # a pure function of the history


def test_a_problem_of_another_family_starts_from_the_untried_default(tmp_path: Path) -> None:
    first = record_campaign(tmp_path)
    vec = first.then("vec", (4096,), VECSCALE)  # element-wise: dims n, another family
    vec.timed_seed()
    assert family_prior(vec.history, vec.spec.problem, "cpu", "fp32") == {}
    (tmp_path / "alone").mkdir()
    alone = Log(tmp_path / "alone", name="vec", shape=(4096,), problem_files=VECSCALE)
    alone.timed_seed()
    filled = vec.fill(1)
    assert isinstance(filled, Filled) and filled.candidates[0].operator == FIRST_OFFLINE
    assert filled == alone.fill(1)


def test_the_family_prior_counts_each_child_as_a_fraction_of_a_pull(tmp_path: Path) -> None:
    first = record_campaign(tmp_path)
    record = earned(first.history, first.spec.problem)
    flip = first.then("flip", (64, 512), ROWFLIP)
    flip.timed_seed()
    prior = family_prior(flip.history, flip.spec.problem, "cpu", "fp32")
    scope = flip.history.scope_candidates(flip.spec.problem, "cpu", "fp32")
    arms = Bandit.of(flip.history, scope, [*OPERATORS, "agent"], prior)
    for name, (pulls, mean) in arms.summary().items():
        assert pulls == 0  # none of its own yet
        assert mean == pytest.approx(record.get(name, 0.0))
        assert arms.arms[name].weight == pytest.approx(prior[name].pulls if name in prior else 0)
    assert {p.pulls / PRIOR_WEIGHT for p in prior.values()} <= set(range(1, 20))
    assert "agent" in arms.ranked([*OPERATORS, "agent"])  # an arm of any name


def test_a_generation_is_filled_while_any_new_child_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the first two ways of drawing a slot spent (no untried operator on the best, no
    draw left), every operator at every point on each parent is tried in turn: the slots
    are still filled, each with a new child, and the same history fills them the same."""
    log = Log(tmp_path)
    seed = log.timed_seed()
    monkeypatch.setattr("actors.search.evolve_strategy.TRIES", 0)
    monkeypatch.setattr("actors.search.evolve_strategy._Draw.on_best", lambda self, tried: None)
    filled = log.fill(1, count=6)
    assert isinstance(filled, Filled) and len(filled.candidates) == 6
    assert len({p.param_key for p in filled.candidates}) == 6
    assert all(p.parents[0] == seed for p in filled.candidates)
    assert log.fill(1, count=6) == filled
    monkeypatch.setattr("actors.search.evolve_strategy.APPLICATIONS", 0)
    empty = log.fill(1, count=6)
    assert isinstance(empty, Filled) and not empty.candidates
