"""The agent's loop: ask the endpoint, run the tools it calls, answer it, until it submits
or a bound is reached.

Each turn is one chat completion with the tools offered (`tools.TOOLS`); each of its tool
calls (at most `MAX_CALLS`) runs (the readers at once; the others in a thread while `hold`
holds a share of the device, as a verifier does, since they compile and run in the
sandbox) and is answered with a `role: "tool"` message of bounded text. A reply without
tool calls is answered with a reminder to use them. Every reply, tool call and give-up is
handed to `record` as it happens (its keyword arguments are an AgentStep's own fields), so
the caller records the whole trail.

It ends with the `Draft` the agent submitted, or `GaveUp` with a reason: the endpoint
failed (down, slow beyond `timeout_s` on every attempt, a reply that is not a chat
completion), a tool the agent called does not exist or got arguments it cannot take, or
a bound was reached (`[writer.agent]`: replies, tokens, wall time).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from actors.campaign.campaign_file import Agent
from actors.search.agent.tools import (
    READ_LESSONS,
    READ_LINEAGE,
    SUBMIT,
    TOOL_NAMES,
    TOOLS,
    BadArguments,
    Draft,
    Workbench,
    bounded,
    parse_draft,
    recorded_arguments,
)
from actors.search.llm.client import LlmClient, LlmFailed, LlmReply, ToolCall

MAX_TEXT_CHARS = 16_000
"""An assistant's text as recorded, at most."""
MAX_CALLS = 8
"""Tool calls in one reply, at most: more end the variation."""
MAX_NAME_CHARS = 100
"""A tool's or a model's name as recorded, at most."""
NUDGE = "Use the tools: compile, verify and time your kernel, then call submit with it."


@dataclass(frozen=True)
class GaveUp:
    """Why the variation ended without a submission: a cause code and a message."""

    cause: str  # endpoint | wall_time | max_steps | max_tokens | too_many_calls | unknown_tool
    # | bad_arguments | config
    message: str

    @property
    def text(self) -> str:
        """As recorded and as the rejection says it: `cause: message`."""
        return f"{self.cause}: {self.message}"


Hold = Callable[[], AbstractAsyncContextManager[object]]
"""A share of the device for one tool run."""


@contextlib.asynccontextmanager
async def no_hold() -> AsyncIterator[None]:
    """A tool run that needs no share of a device (tests with no bus)."""
    yield


Record = Callable[..., object]
"""Takes one item of the trail as keyword arguments: an AgentStep's own fields (`step`,
`kind`: reply | tool | gave_up, `content`, `tool`, `call_id`, `arguments`, `result`,
`tool_calls`, `usage`, `latency_s`, `model`)."""


class _Stop(Exception):
    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.gave_up = GaveUp(cause, message)


async def run_agent(
    client: LlmClient,
    opening: Sequence[Mapping[str, Any]],
    bench: Workbench,
    bounds: Agent,
    record: Record,
    hold: Hold = no_hold,
) -> Draft | GaveUp:
    """The loop (see the module); `opening` is the system and user messages."""
    messages: list[Mapping[str, Any]] = list(opening)
    state = _State()
    try:
        async with asyncio.timeout(bounds.wall_seconds()):
            return await _turns(client, messages, bench, bounds, record, hold, state)
    except TimeoutError:
        ended = GaveUp(
            "wall_time",
            f"no submission within the wall time of {bounds.wall_seconds():g} s "
            f"({state.steps} replies)",
        )
    except _Stop as stop:
        ended = stop.gave_up
    record(step=state.steps, kind="gave_up", content=ended.text)
    return ended


@dataclass
class _State:
    steps: int = 0
    tokens: int = 0


async def _turns(
    client: LlmClient,
    messages: list[Mapping[str, Any]],
    bench: Workbench,
    bounds: Agent,
    record: Record,
    hold: Hold,
    state: _State,
) -> Draft:
    while state.steps < bounds.max_steps:
        state.steps += 1
        reply = await _ask(client, messages)
        state.tokens += _tokens(reply)
        record(
            step=state.steps,
            kind="reply",
            content=bounded(reply.text, MAX_TEXT_CHARS),
            tool_calls=[c.name[:MAX_NAME_CHARS] for c in reply.tool_calls[:MAX_CALLS]],
            usage=dict(reply.usage),
            latency_s=reply.latency_s,
            model=reply.model[:MAX_NAME_CHARS],
        )
        if len(reply.tool_calls) > MAX_CALLS:
            raise _Stop("too_many_calls", f"a reply called {len(reply.tool_calls)} tools at once")
        if not reply.tool_calls:
            messages += [{"role": "assistant", "content": reply.text}, _user(NUDGE)]
        else:
            messages.append(
                {"role": "assistant", "content": reply.text, "tool_calls": reply.tool_calls}
            )
        for call in reply.tool_calls:
            submitted = await _call(call, bench, messages, record, hold, state.steps)
            if submitted is not None:
                return submitted
        if state.tokens > bounds.max_tokens:
            raise _Stop(
                "max_tokens",
                f"no submission within {bounds.max_tokens} tokens ({state.tokens} used)",
            )
    raise _Stop("max_steps", f"no submission within {bounds.max_steps} replies")


async def _ask(client: LlmClient, messages: list[Mapping[str, Any]]) -> LlmReply:
    try:
        return await client.complete(messages, TOOLS)
    except LlmFailed as exc:
        what = {
            "connection": "endpoint unreachable",
            "timeout": f"endpoint gave no reply within {client.config.timeout_s:g} s",
            "malformed_reply": "endpoint answered something that is not a chat completion",
        }.get(exc.reason, f"endpoint failed ({exc.reason})")
        raise _Stop("endpoint", f"{what} after {exc.attempts} attempts: {exc.message}") from exc


async def _call(
    call: ToolCall,
    bench: Workbench,
    messages: list[Mapping[str, Any]],
    record: Record,
    hold: Hold,
    step: int,
) -> Draft | None:
    """Run one tool call and answer it; the submitted draft when it is `submit`."""
    started = time.monotonic()
    arguments = recorded_arguments(call.arguments)

    def done(result: str) -> None:
        record(
            step=step,
            kind="tool",
            tool=call.name[:MAX_NAME_CHARS],
            call_id=call.id[:MAX_NAME_CHARS],
            arguments=arguments,
            result=result,
            latency_s=time.monotonic() - started,
        )
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})

    if call.name not in TOOL_NAMES:
        name = call.name[:MAX_NAME_CHARS]
        done(f"unknown tool {name!r}")
        raise _Stop("unknown_tool", f"the agent called an unknown tool {name!r}")
    if call.name in (READ_LINEAGE, READ_LESSONS):
        done(bench.read(call.name))
        return None
    try:
        draft = parse_draft(call.arguments, bench.parent.flags)
    except BadArguments as exc:
        done(f"bad arguments: {exc}")
        raise _Stop("bad_arguments", f"{call.name} was called with bad arguments: {exc}") from exc
    if call.name == SUBMIT:
        done("submitted")
        return draft
    async with hold():
        run = asyncio.ensure_future(asyncio.to_thread(bench.run, call.name, draft))
        try:
            answer = await asyncio.shield(run)
        except asyncio.CancelledError:
            # The wall time is up: the sandboxed run ends on its own limits, and the share
            # of the device is held until it has, so no timed window overlaps it.
            await asyncio.wait([run])
            done("stopped: the variation's wall time ran out")
            raise
    done(answer)
    return None


def _tokens(reply: LlmReply) -> int:
    usage = reply.usage
    parts = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
    return usage.get("total_tokens", parts)


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}
