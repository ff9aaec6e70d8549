"""The agent operator against a scripted OpenAI-compatible server over a real socket (the
real `openai` SDK), with its tools run for real (the C compiler, the sandboxed harness):
a script that compiles a broken kernel, reads the error, fixes it, verifies, times and
submits; endpoints that are down, slow or answer garbage, and an agent that never submits,
each ending the variation with its cause; the trail read back for a redelivery; and the
`agent_steps` view over a real DuckDB store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from actors.campaign.campaign_file import Agent, Writer
from actors.roles.kernel_writer import decide_agent
from actors.runtime import Reactions
from actors.search.agent.loop import MAX_CALLS
from actors.search.agent.operator import FAILED, AgentOperator, outcome, recorded_outcome
from actors.search.lineage import EVOLVE_TEMPLATE, context_for
from actors.search.operators.protocol import ParentKernel, Refusal, Variation
from actors.search.strategy import Filled, Planned
from eventstore.codec import encode
from eventstore.duckdb_store import DuckDBEventStore
from eventstore.events import MAX_EVENT_BYTES, AgentStep, KernelWritten
from eventstore.store import Recorded
from gpu_workers.cpu.backend import CpuBackend
from gpu_workers.probes import PROBE_LIMITS, SMALL_SHAPES, probe_backend, probe_verify
from gpu_workers.targets import backend_for
from gpu_workers.verification import trial_shapes
from kernels.loading import load_problem
from tests.evolve_history import ACTOR, SEED, Log
from tests.fake_openai import Delay, FakeOpenAI, Raw, Reply, ToolCalls

FIXED = SEED.replace("* 0.5f + 1.0f", "* 0.5f + 1.0f; /* fixed */")
BROKEN = FIXED.replace("int64_t j = 0", "int64_t j = undeclared_start")
SHAPE = {"rows": 64, "cols": 512}
PARENT_ID = "evolve-test:g0:c0"


def _writer(base_url: str, **agent: Any) -> Writer:
    return Writer(
        kind="evolve",
        base_url=base_url,
        model="fake-agent",
        api_key_env="KF_TEST_KEY",
        timeout_s=agent.pop("timeout_s", 20.0),
        attempts=agent.pop("attempts", 1),
        backoff_s=0.01,
        agent=Agent(**agent),
    )


class Item(SimpleNamespace):
    """One item of the trail as the agent recorded it (an AgentStep's own fields)."""

    step: int
    kind: str
    content: str
    tool: str
    arguments: str
    result: str
    tool_calls: list[str]
    usage: dict[str, int]


BLANK: dict[str, Any] = {"content": "", "tool": "", "arguments": "", "result": ""}


def _vary(
    tmp_path: Path, writer: Writer, lessons: tuple[str, ...] = (), held: list[str] | None = None
) -> tuple[Variation | Refusal, list[Item]]:
    log = Log(tmp_path)
    problem = load_problem(log.spec.problem)
    parent = ParentKernel(PARENT_ID, SEED, ("-O3",))
    trail: list[Item] = []

    def record(**item: Any) -> None:
        trail.append(Item(**{**BLANK, "tool_calls": [], "usage": {}, **item}))

    @contextlib.asynccontextmanager
    async def hold() -> AsyncIterator[None]:
        if held is not None:
            held.append(f"held at {len(trail)}")
        yield

    operator = AgentOperator(writer, problem, "fp32", SHAPE, record, hold)
    context = replace(context_for(log.spec), lessons=lessons)
    child = asyncio.run(operator.apply([parent], {"attempt": 0}, context))
    return child, trail


def _tool_answers(request: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in request["messages"] if m["role"] == "tool"]


def test_the_agent_repairs_a_compile_error_then_verifies_times_and_submits(
    tmp_path: Path,
) -> None:
    script = [
        ToolCalls((("read_lineage", {}), ("read_lessons", {}))),
        ToolCalls((("compile", {"source": BROKEN}),)),
        ToolCalls((("compile", {"source": FIXED, "flags": ["-O3"]}),)),
        ToolCalls((("verify", {"source": FIXED}),)),
        ToolCalls((("time", {"source": FIXED}),)),
        ToolCalls((("submit", {"source": FIXED}),), text="Fixed the loop start."),
    ]
    held: list[str] = []
    with FakeOpenAI(script) as server:
        child, trail = _vary(tmp_path, _writer(server.base_url), ("halving pays",), held)
        requests = list(server.requests)

    assert isinstance(child, Variation), child
    assert (child.source, child.flags, child.operator) == (FIXED, ("-O3",), "agent")
    assert child.parents == (PARENT_ID,) and "/* fixed */" in child.diff
    assert len(requests) == 6 and server.unscripted == 0
    offered = {t["function"]["name"] for t in requests[0]["tools"]}
    assert offered == {"read_lineage", "read_lessons", "compile", "verify", "time", "submit"}
    assert requests[0]["tool_choice"] == "auto"
    system, opening = requests[0]["messages"]
    assert "`submit` hands the final kernel in" in system["content"]
    assert SEED.rstrip() in opening["content"] and "- halving pays" in opening["content"]
    lineage, lessons = _tool_answers(requests[1])
    assert PARENT_ID in lineage and "halving pays" in lessons
    (compile_error,) = _tool_answers(requests[2])[2:]
    assert compile_error.startswith("REJECTED at compile") and "undeclared_start" in compile_error
    assert _tool_answers(requests[3])[3] == "OK: compiled, static passed"
    assert _tool_answers(requests[4])[4].startswith("VERIFIED at ")
    timed = _tool_answers(requests[5])[5]
    assert timed.startswith("median ") and "advice only" in timed
    assert "{'rows': 64, 'cols': 512}" in timed
    # the assistant's calls travel back with the answers, each answer to its call's id
    calls = [m for m in requests[5]["messages"] if m["role"] == "assistant"]
    assert [c["tool_calls"][0]["function"]["name"] for c in calls] == [
        "read_lineage",
        "compile",
        "compile",
        "verify",
        "time",
    ]

    assert [(i.step, i.kind, i.tool) for i in trail] == [
        (1, "reply", ""),
        (1, "tool", "read_lineage"),
        (1, "tool", "read_lessons"),
        (2, "reply", ""),
        (2, "tool", "compile"),
        (3, "reply", ""),
        (3, "tool", "compile"),
        (4, "reply", ""),
        (4, "tool", "verify"),
        (5, "reply", ""),
        (5, "tool", "time"),
        (6, "reply", ""),
        (6, "tool", "submit"),
    ]
    # compile, compile, verify and time ran holding a share of the device; readers and
    # the submission did not
    assert held == ["held at 4", "held at 6", "held at 8", "held at 10"]
    assert trail[4].result == compile_error and trail[-1].result == "submitted"
    assert trail[-2].content == "Fixed the loop start." and trail[-2].tool_calls == ["submit"]
    assert trail[0].usage == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    assert json.loads(trail[-1].arguments) == {"source": FIXED}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gave_up(child: Variation | Refusal, trail: list[Item], cause: str) -> str:
    assert isinstance(child, Refusal), child
    assert (child.operator, child.reason) == ("agent", FAILED)
    assert child.message.startswith(f"{cause}: ")
    assert trail[-1].kind == "gave_up" and trail[-1].content == child.message
    return child.message


def test_an_endpoint_that_is_down_ends_the_variation(tmp_path: Path) -> None:
    writer = _writer(f"http://127.0.0.1:{_free_port()}/v1", attempts=2)
    child, trail = _vary(tmp_path, writer)
    message = _gave_up(child, trail, "endpoint")
    assert "endpoint unreachable after 2 attempts" in message
    assert [i.kind for i in trail] == ["gave_up"]


def test_an_endpoint_slower_than_the_timeout_ends_the_variation(tmp_path: Path) -> None:
    with FakeOpenAI([Delay(30.0)]) as server:
        child, trail = _vary(tmp_path, _writer(server.base_url, timeout_s=0.5))
        assert len(server.requests) == 1
    assert "endpoint gave no reply within 0.5 s after 1 attempts" in _gave_up(
        child, trail, "endpoint"
    )


def test_the_wall_time_bounds_the_whole_variation(tmp_path: Path) -> None:
    with FakeOpenAI([ToolCalls((("read_lessons", {}),)), Delay(30.0)]) as server:
        child, trail = _vary(tmp_path, _writer(server.base_url, wall_time="2s"))
    assert "no submission within the wall time of 2 s (2 replies)" in _gave_up(
        child, trail, "wall_time"
    )
    assert [i.kind for i in trail] == ["reply", "tool", "gave_up"]


@pytest.mark.parametrize(
    ("answer", "cause", "said"),
    [
        (Raw(b"this is not JSON"), "endpoint", "not a chat completion"),
        (Raw(b'{"id": "x", "choices": []}'), "endpoint", "no choices"),
        (ToolCalls((("rm_rf", {"path": "/"}),)), "unknown_tool", "unknown tool 'rm_rf'"),
        (ToolCalls((("compile", "{not json"),)), "bad_arguments", "not JSON"),
        (ToolCalls((("verify", {"flags": ["-O2"]}),)), "bad_arguments", "`source`"),
    ],
)
def test_garbage_from_the_endpoint_ends_the_variation(
    tmp_path: Path, answer: Any, cause: str, said: str
) -> None:
    with FakeOpenAI([answer]) as server:
        child, trail = _vary(tmp_path, _writer(server.base_url))
        assert len(server.requests) == 1
    assert said in _gave_up(child, trail, cause)


def test_a_reply_with_too_many_tool_calls_ends_the_variation(tmp_path: Path) -> None:
    calls = tuple(("read_lessons", {}) for _ in range(MAX_CALLS + 1))
    with FakeOpenAI([ToolCalls(calls)]) as server:
        child, trail = _vary(tmp_path, _writer(server.base_url))
    assert "a reply called 9 tools at once" in _gave_up(child, trail, "too_many_calls")
    assert [i.kind for i in trail] == ["reply", "gave_up"]  # no tool ran


def test_an_agent_that_never_submits_stops_at_max_steps(tmp_path: Path) -> None:
    script = [Reply("Let me think."), ToolCalls((("read_lessons", {}),)), Reply("unused")]
    with FakeOpenAI(script) as server:
        child, trail = _vary(tmp_path, _writer(server.base_url, max_steps=2))
        requests = list(server.requests)
    assert "no submission within 2 replies" in _gave_up(child, trail, "max_steps")
    assert len(requests) == 2
    # a reply without a tool call is answered with a reminder to use the tools
    assert "call submit" in requests[1]["messages"][-1]["content"]


def test_the_token_bound_ends_the_variation(tmp_path: Path) -> None:
    script = [ToolCalls((("read_lessons", {}),), prompt_tokens=900, completion_tokens=200)]
    with FakeOpenAI(script) as server:
        child, trail = _vary(tmp_path, _writer(server.base_url, max_tokens=1000))
    assert "no submission within 1000 tokens (1100 used)" in _gave_up(child, trail, "max_tokens")


def _steps(trail: list[Any], candidate: str = "evolve-test:g1:c0") -> list[AgentStep]:
    return [
        AgentStep(
            event_id=f"s{n}",
            campaign_id="evolve-test",
            actor=ACTOR,
            ts=datetime(2026, 1, 1, tzinfo=UTC),
            problem="rowscale",
            target="cpu",
            candidate_id=candidate,
            generation=1,
            **vars(item),
        )
        for n, item in enumerate(trail)
    ]


def test_a_recorded_trail_gives_the_same_child_without_the_endpoint(tmp_path: Path) -> None:
    script = [ToolCalls((("submit", {"source": FIXED}),))]
    with FakeOpenAI(script) as server:
        child, trail = _vary(tmp_path, _writer(server.base_url))
    parents = [ParentKernel(PARENT_ID, SEED, ("-O3",))]
    ended = recorded_outcome(_steps(trail), ("-O3",))
    assert outcome(parents, {"attempt": 0}, ended) == child  # type: ignore[arg-type]
    assert recorded_outcome(_steps(trail)[:1], ("-O3",)) is None  # no end yet: run again

    down = _writer(f"http://127.0.0.1:{_free_port()}/v1")
    refused, gave_up = _vary(tmp_path, down)
    again = outcome(parents, {}, recorded_outcome(_steps(gave_up), ("-O3",)))  # type: ignore[arg-type]
    assert again == refused


def test_the_agent_steps_view_shows_the_trail(tmp_path: Path) -> None:
    trail = [
        Item(step=1, kind="reply", content="try", tool_calls=["compile"],
             usage={"total_tokens": 30}),
        Item(step=1, kind="tool", tool="compile", call_id="c1", arguments='{"source": "x"}',
             result="REJECTED at compile: compile_error", latency_s=0.2),
        Item(step=1, kind="gave_up", content="max_steps: no submission within 1 replies"),
    ]  # fmt: skip
    events = _steps(trail)
    store = DuckDBEventStore(tmp_path / "events.duckdb")
    try:
        store.append([Recorded(e, encode(e)) for e in events])
        result = store.query(
            "SELECT candidate_id, step, kind, tool, arguments, result, tool_calls, tokens "
            "FROM agent_steps ORDER BY position"
        )
    finally:
        store.close()
    assert [tuple(row) for row in result.rows] == [
        ("evolve-test:g1:c0", 1, "reply", "", "", "", ["compile"], 30),
        ("evolve-test:g1:c0", 1, "tool", "compile", '{"source": "x"}',
         "REJECTED at compile: compile_error", [], None),
        ("evolve-test:g1:c0", 1, "gave_up", "", "", "", [], None),
    ]  # fmt: skip


def test_a_redelivered_proposal_emits_the_recorded_trail_again_and_asks_nothing(
    tmp_path: Path,
) -> None:
    script = [
        ToolCalls((("compile", {"source": FIXED}),)),
        ToolCalls((("submit", {"source": FIXED}),)),
    ]
    with FakeOpenAI(script) as server:
        log = Log(tmp_path, writer=_writer(server.base_url))
        seed = log.timed_seed()
        (proposal,) = log.propose(
            1, [Planned(EVOLVE_TEMPLATE, {"attempt": 0}, "agent-key", "agent", [seed])]
        )
        context = context_for(log.spec)
        first = Reactions(proposal, ACTOR)
        asyncio.run(decide_agent(log.history, proposal, first, log.spec, context, []))
        assert len(server.requests) == 2
        trail = [e for e in first.events if isinstance(e, AgentStep)]
        again = Reactions(proposal, ACTOR)
        asyncio.run(decide_agent(log.history, proposal, again, log.spec, context, trail))
        assert len(server.requests) == 2  # the endpoint was not asked again
    assert [e.type for e in first.events] == ["AgentStep"] * 4 + ["KernelWritten"]
    when = datetime(2026, 1, 1, tzinfo=UTC)
    assert [msgspec.structs.replace(e, ts=when) for e in again.events] == [
        msgspec.structs.replace(e, ts=when) for e in first.events
    ]
    written = first.events[-1]
    assert isinstance(written, KernelWritten)
    assert (written.writer, written.operator, written.source) == ("agent", "agent", FIXED)
    assert written.parents == [seed] and "/* fixed */" in written.diff


def test_the_agent_is_an_arm_only_where_the_writer_has_an_endpoint(tmp_path: Path) -> None:
    (tmp_path / "offline").mkdir()
    (tmp_path / "online").mkdir()
    offline = Log(tmp_path / "offline")
    offline.timed_seed()
    without = offline.fill(1)
    assert isinstance(without, Filled)
    assert "agent" not in [p.operator for p in without.candidates]

    online = Log(tmp_path / "online", writer=_writer("http://127.0.0.1:9/v1"))
    seed = online.timed_seed()
    filled = online.fill(1)
    assert isinstance(filled, Filled)
    operators = [p.operator for p in filled.candidates]
    assert operators[0] == "agent" and operators.count("agent") == 1  # tried first, once
    agent = filled.candidates[0]
    assert (agent.params, agent.parents) == ({"attempt": 0}, [seed])
    assert [p.param_key for p in filled.candidates[1:]] == [
        p.param_key for p in without.candidates[:3]
    ]  # the offline operators fill the other slots as they would without the agent


def test_the_quick_verification_runs_the_smallest_test_shapes_in_the_sandbox(
    tmp_path: Path,
) -> None:
    problem = load_problem(Log(tmp_path).spec.problem)
    backend = probe_backend("cpu")
    assert isinstance(backend, CpuBackend) and backend is not backend_for("cpu")
    assert backend.verify_limits == backend.bench_limits == PROBE_LIMITS  # a spinning draft ends
    verdict = probe_verify(problem, backend, FIXED, ("-O3",), "fp32")
    assert verdict.verified and verdict.seed is not None
    smallest = sorted(trial_shapes(problem, verdict.seed), key=problem.nbytes)[:SMALL_SHAPES]
    assert {json.dumps(t.shape, sort_keys=True) for t in verdict.trials} == {
        json.dumps(s, sort_keys=True) for s in smallest
    }
    wrong = probe_verify(problem, backend, SEED.replace("0.5f", "0.6f"), ("-O3",), "fp32")
    assert wrong.rejection is not None and wrong.rejection.reason == "wrong_value"


def test_a_submission_with_flags_outside_the_policy_is_refused(tmp_path: Path) -> None:
    script = [ToolCalls((("submit", {"source": FIXED, "flags": ["-fplugin=/tmp/x.so"]}),))]
    with FakeOpenAI(script) as server:
        child, _ = _vary(tmp_path, _writer(server.base_url))
    assert isinstance(child, Refusal) and child.reason == "bad_flags"
    assert "-fplugin=/tmp/x.so" in child.message


@pytest.mark.parametrize(
    ("call", "cause"),
    [
        (("rm_rf", "\x01" * 200_000), "unknown_tool"),  # 6 bytes a character as JSON
        (("submit", {"source": "é" * 70_000}), "bad_arguments"),
        (("x" * 300_000, "{}"), "unknown_tool"),
    ],
)
def test_huge_arguments_are_recorded_within_the_event_cap(
    tmp_path: Path, call: Any, cause: str
) -> None:
    with FakeOpenAI([ToolCalls((call,))]) as server:
        child, trail = _vary(tmp_path, _writer(server.base_url))
    _gave_up(child, trail, cause)
    for step in _steps(trail):
        assert len(encode(step)) < MAX_EVENT_BYTES  # encode refuses an event over the cap
