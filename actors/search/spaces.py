"""The design spaces a planner searches for a problem and target, resolved in one place.

A problem's spaces are the built-in templates of a built-in problem, the `SPACES` its
problem file declares (keyed by the resolved `path.py:NAME`), the `[[spaces]]` of the
campaign file, a generic space around each seed kernel, and the fusion space of a graph
problem. `kfactory problems show` and the kernel writer resolve them through here too.

Seeds, a problem file's `SPACES` and the campaign's `[[spaces]]` are cpu spaces: other
targets get their built-in templates and the fusion space only. Seed spaces come first;
names must be unique among a problem's spaces, and only the spaces written for the
campaign's dtype are searched. `kernels/user_spaces.py` builds the user's spaces.
`seed_points`: each seed as it is; `starting_points`: generation 0 of a search from
points, each space's best known point (a seed's is the seed as it is; a template's, a
space's declared `best`), so a search never ends below what is already known;
`known_elsewhere`: the points measured fastest on other kinds of host that this one's
spaces hold (the template search proposes them next).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from actors.campaign.campaign_file import CampaignSpec
from actors.search.template_search import Proposal, Space
from gpu_workers.targets import target_of
from kernels.design_space import Template
from kernels.fusion.plan import fusion_space
from kernels.loading import load_problem
from kernels.templates import templates_for
from kernels.user_spaces import (
    GenericSpace,
    KernelSpace,
    SpaceError,
    build_space,
    declared_in_problem_file,
    seed_spaces,
)


def design_spaces(
    problem: str, target: str, dtype: str = "fp32", campaign: CampaignSpec | None = None
) -> Sequence[Space]:
    """Every space of the problem (and of the campaign, if given) written for `dtype`."""
    loaded = load_problem(problem)
    spaces: list[Space] = [
        t for t in kernel_templates(problem, target, campaign) if t.accepts(dtype)
    ]
    if loaded.graph:
        fused = fusion_space(problem, target)
        if fused.accepts(dtype):
            spaces.append(fused)
    return spaces


def kernel_templates(
    problem: str, target: str, campaign: CampaignSpec | None = None
) -> list[Template]:
    """The templates (built-in and the user's) and seed spaces of the problem, seeds first."""
    spec = load_problem(problem).load_spec
    takes_user_spaces = target_of(target).takes_user_spaces
    found: list[Template] = []
    if campaign is not None and takes_user_spaces:
        found += seed_spaces(spec, campaign.seed.sources)
    found += templates_for(spec, target)
    if takes_user_spaces:
        for declared in declared_in_problem_file(spec):
            base = Path(spec.rpartition(":")[0]).resolve().parent
            found.append(build_space(declared, base, spec))
        for entry in campaign.spaces if campaign is not None else ():
            declared = KernelSpace(
                file=entry.file,
                params=entry.params,
                restrictions=entry.restrictions,
                best=entry.best,
                name=entry.name,
                algorithm=entry.algorithm,
            )
            found.append(build_space(declared, Path(entry.file).parent, spec))
    names = [t.name for t in found]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise SpaceError(
            f"spaces of {problem} share the name(s) {repeated}; give them names of their own"
        )
    return found


def template_named(campaign: CampaignSpec, name: str) -> Template | None:
    """The campaign's template called `name`, as the planner resolved it; None if none."""
    for template in kernel_templates(campaign.problem, campaign.target, campaign):
        if template.name == name:
            return template
    return None


def seed_points(campaign: CampaignSpec) -> list[Proposal]:
    """Each seed kernel as it is: generation 0 verifies and times them first."""
    return [
        Proposal(t.name, dict(t.defaults))
        for t in kernel_templates(campaign.problem, campaign.target, campaign)
        if isinstance(t, GenericSpace)
    ]


def starting_points(campaign: CampaignSpec) -> list[Proposal]:
    """Generation 0 of a search from points: each space's best known point, the seeds' (as
    they are) first."""
    return [
        Proposal(t.name, dict(t.best_known))
        for t in kernel_templates(campaign.problem, campaign.target, campaign)
    ]


def known_elsewhere(campaign: CampaignSpec) -> list[Proposal]:
    """The points measured fastest on other kinds of host that this host's spaces hold."""
    return [
        Proposal(t.name, dict(point))
        for t in kernel_templates(campaign.problem, campaign.target, campaign)
        for point in t.known_elsewhere
        if t.is_valid(point)
    ]
