"""The agent operator (`agent`): a variation operator that drives an LLM agent through the
chat API with tool calls: it reads the parent's lineage and the lessons, edits the kernel,
compiles, verifies and times it, repairs it, and submits a child.

It is an `AsyncVariationOperator`: one more operator name to the planner and its bandit,
awaited by the kernel writer, which records each item of its trail as an AgentStep event.
Its child is a `Variation` like any other (operator "agent", the parent, the diff against
it) and goes through the same verifier and benchmarker; a variation that ends without a
submission is a `Refusal` (`agent_failed`) with the cause. `recorded_outcome` reads the
outcome back from a recorded trail, so a redelivered proposal never asks the endpoint
again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from actors.campaign.campaign_file import Writer
from actors.search.agent.loop import GaveUp, Hold, Record, no_hold, run_agent
from actors.search.agent.tools import SUBMIT, BadArguments, Draft, Workbench, parse_draft
from actors.search.llm import prompts
from actors.search.llm.client import LlmClient, LlmConfig, LlmConfigError
from actors.search.operators.protocol import (
    Context,
    Params,
    ParamSpace,
    ParentKernel,
    Refusal,
    Variation,
    variation,
)
from actors.search.operators.registry import AGENT, AgentSearched
from eventstore.events import AgentStep
from gpu_workers.cpu.build import bad_flags
from gpu_workers.targets import target_of
from kernels.spec import Problem

FAILED = "agent_failed"
"""The write stage's rejection reason of a variation that ended without a submission."""


@dataclass(frozen=True)
class AgentOperator:
    """The agent, set up for one campaign: its endpoint and bounds (`[writer]`,
    `[writer.agent]`), the problem at the campaign's dtype and timed shape, where each
    item of the trail goes, and how a tool run holds a share of the device."""

    writer: Writer
    problem: Problem
    dtype: str
    shape: dict[str, int] | None
    record: Record
    hold: Hold = no_hold

    name = AGENT
    arity = 1

    def space(self) -> ParamSpace:
        return AgentSearched().space()

    async def apply(
        self, parents: Sequence[ParentKernel], params: Params, context: Context
    ) -> Variation | Refusal:
        if target_of(context.target).source_language != "c":
            return Refusal(AGENT, "wrong_target", f"the agent writes C, not {context.target}")
        if len(parents) != 1:
            return Refusal(AGENT, "arity", f"the agent takes 1 parent, not {len(parents)}")
        parent = parents[0]
        bounds = self.writer.agent
        bench = Workbench(
            self.problem, context.target, self.dtype, self.shape, parent, context.lessons
        )
        opening = prompts.agent(
            self.problem, parent, context, dtype=self.dtype, max_steps=bounds.max_steps
        )
        try:
            client = LlmClient(LlmConfig.of(self.writer))
        except LlmConfigError as exc:
            gave_up = GaveUp("config", str(exc))
            self.record(step=0, kind="gave_up", content=gave_up.text)
            return outcome(parents, params, gave_up)
        async with client:
            ended = await run_agent(client, opening, bench, bounds, self.record, self.hold)
        return outcome(parents, params, ended)


def outcome(
    parents: Sequence[ParentKernel], params: Params, ended: Draft | GaveUp
) -> Variation | Refusal:
    """The child of a submission (its flags within the policy), or the refusal."""
    if isinstance(ended, GaveUp):
        return Refusal(AGENT, FAILED, ended.text)
    refused = bad_flags(ended.flags)
    if refused:
        message = f"the agent submitted flags outside the policy: {refused}"
        return Refusal(AGENT, "bad_flags", message)
    return variation(AGENT, parents, params, ended.source, ended.flags)


def recorded_outcome(
    trail: Sequence[AgentStep], default_flags: Sequence[str]
) -> Draft | GaveUp | None:
    """What a recorded trail ended with: the submitted draft, the give-up, or None while it
    has no end (the variation must run)."""
    for step in trail:
        if step.kind == "tool" and step.tool == SUBMIT and step.result == "submitted":
            try:
                return parse_draft(step.arguments, default_flags)
            except BadArguments as exc:  # recorded whole, so only a forged trail lands here
                return GaveUp("bad_arguments", f"the recorded submission cannot be read: {exc}")
        if step.kind == "gave_up":
            cause, _, message = step.content.partition(": ")
            return GaveUp(cause, message)
    return None
