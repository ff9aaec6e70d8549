"""A recorded candidate as a variation operator's parent: its source and flags from its
KernelWritten, the steps that made it from its root (each operator proposal up its first
parents), and the evidence on it (verdict, worst element, rejection, time, roofline).

The evolve strategy (to try an operator before it proposes it) and the kernel writer (to
apply it) build the same `ParentKernel`s from the same history, so the child the writer
records is the one the strategy saw. `context_for` is the operator's `Context`: the
problem, the target, the lessons and the problem's relative tolerance at the dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

from actors.campaign.campaign_file import CampaignSpec
from actors.campaign.history import Candidate, History
from actors.search.operators.protocol import (
    Context,
    Evidence,
    ParentKernel,
    Step,
    TemplatePoint,
)
from actors.search.operators.registry import AGENT, OPERATORS
from actors.search.operators.template_point import TemplateStep, point_after
from kernels.loading import load_problem
from kernels.templates import TEMPLATES

TEMPLATE_STEP = TemplateStep.name
EVOLVE_TEMPLATE = "evolve"
"""The template of a candidate a variation operator writes from its parents."""


def is_operator_proposal(candidate: Candidate) -> bool:
    """Whether a variation operator writes this candidate (its proposal names one)."""
    proposal = candidate.proposal
    return proposal.template == EVOLVE_TEMPLATE and (
        proposal.operator in OPERATORS or proposal.operator == AGENT
    )


def lineage_of(history: History, candidate: Candidate) -> tuple[Step, ...]:
    """The operator steps from the candidate's root to it, earliest first (a seed or a
    template point is a root: no steps)."""
    steps: list[Step] = []
    seen: set[str] = set()
    current: Candidate | None = candidate
    while current is not None and is_operator_proposal(current):
        if current.candidate_id in seen:
            break  # a malformed history cannot loop the walk
        seen.add(current.candidate_id)
        proposal = current.proposal
        steps.append(
            Step(proposal.operator, tuple(sorted(proposal.params.items())), tuple(proposal.parents))
        )
        current = history.candidates.get(proposal.parents[0]) if proposal.parents else None
    return tuple(reversed(steps))


def evidence_of(candidate: Candidate) -> Evidence:
    """What the history knows of a candidate's kernel."""
    verified = candidate.verified
    rejected = candidate.rejected
    timed = candidate.benchmark
    return Evidence(
        verified=True if verified else (False if rejected else None),
        rejection=rejected.reason if rejected else "",
        worst=str(
            (verified.evidence if verified else rejected.evidence if rejected else {}).get(
                "worst", ""
            )
        ),
        median_ns=timed.median_ns if timed else None,
        roofline_fraction=timed.roofline_fraction if timed else None,
    )


def parent_kernel(history: History, candidate: Candidate) -> ParentKernel | None:
    """The candidate as a parent; None if it has no recorded kernel."""
    written = candidate.written
    if written is None:
        return None
    return ParentKernel(
        candidate.candidate_id,
        written.source,
        tuple(written.flags),
        lineage_of(history, candidate),
        evidence_of(candidate),
        template_point_of(history, candidate),
    )


def template_point_of(history: History, candidate: Candidate) -> TemplatePoint | None:
    """The built-in template point the candidate's kernel renders: a template proposal's, or
    its root's moved by each `template` step after it (None once another operator edited
    the source)."""
    moves: list[Candidate] = []
    seen: set[str] = set()
    current: Candidate | None = candidate
    while current is not None and is_operator_proposal(current):
        if current.proposal.operator != TEMPLATE_STEP or current.candidate_id in seen:
            return None
        seen.add(current.candidate_id)
        moves.append(current)
        parents = current.proposal.parents
        current = history.candidates.get(parents[0]) if parents else None
    if current is None or current.proposal.template not in TEMPLATES:
        return None
    point: TemplatePoint | None = (
        current.proposal.template,
        tuple(sorted(current.proposal.params.items())),
    )
    for step in reversed(moves):
        point = point_after(point, step.proposal.params)
    return point


def parents_of(history: History, candidate_ids: Sequence[str]) -> list[ParentKernel] | None:
    """The parents with these ids, in order; None if one has no recorded kernel."""
    found = [history.candidates.get(cid) for cid in candidate_ids]
    kernels = [parent_kernel(history, c) for c in found if c is not None]
    if len(kernels) != len(candidate_ids) or any(k is None for k in kernels):
        return None
    return [k for k in kernels if k is not None]


def context_for(spec: CampaignSpec, lessons: Sequence[str] = ()) -> Context:
    """The operators' context for a campaign (reads the problem's file)."""
    problem = load_problem(spec.problem)
    tolerance = problem.tolerances.get(spec.dtype)
    return Context(
        problem=spec.problem,
        target=spec.target,
        lessons=tuple(lessons),
        rtol=tolerance.rtol if tolerance is not None else None,
        dtype=spec.dtype,
    )
