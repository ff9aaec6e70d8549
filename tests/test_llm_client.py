"""The LLM client against a local OpenAI-compatible server, through the real openai SDK."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from actors.search.llm.client import (
    LOCAL_PLACEHOLDER_KEY,
    LlmClient,
    LlmConfig,
    LlmConfigError,
    LlmFailed,
    ToolCall,
    resolve_api_key,
)
from tests.fake_openai import Delay, Drop, FakeOpenAI, HttpError, Raw, Reply, ToolCalls

MESSAGES = [
    {"role": "system", "content": "You write kernels."},
    {"role": "user", "content": "Write softmax."},
]


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


def config(server: FakeOpenAI, **overrides: float | int) -> LlmConfig:
    base = LlmConfig(
        base_url=server.base_url,
        model="fake-coder",
        api_key_env="KF_TEST_UNSET_KEY_VARIABLE",
        timeout_s=2.0,
        max_attempts=3,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
        jitter=0.5,
    )
    return msgspec.structs.replace(base, **overrides)


def client(server: FakeOpenAI, **overrides: float | int) -> LlmClient:
    return LlmClient(config(server, **overrides), api_key="test-key", rng=random.Random(0))


@pytest.mark.asyncio
async def test_a_good_reply_returns_text_and_usage(server: FakeOpenAI) -> None:
    server.push(Reply("```c\nvoid kernel(void) {}\n```", prompt_tokens=120, completion_tokens=30))
    async with client(server) as llm:
        reply = await llm.complete(MESSAGES)
    assert reply.text == "```c\nvoid kernel(void) {}\n```"
    assert reply.usage == {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}
    assert reply.attempts == 1
    assert reply.model == "fake-coder"
    assert reply.finish_reason == "stop"
    assert reply.latency_s > 0
    # what went over the wire: the model, the messages in order, the key
    assert len(server.requests) == 1
    assert server.requests[0]["model"] == "fake-coder"
    assert server.requests[0]["messages"] == MESSAGES
    assert server.paths == ["/v1/chat/completions"]
    assert server.auth_headers == ["Bearer test-key"]


@pytest.mark.asyncio
async def test_a_server_error_is_retried_and_then_succeeds(server: FakeOpenAI) -> None:
    server.push(HttpError(500, "the model crashed"), Reply("second time lucky"))
    async with client(server) as llm:
        reply = await llm.complete(MESSAGES)
    assert reply.text == "second time lucky"
    assert reply.attempts == 2
    assert len(server.requests) == 2
    assert server.requests[0] == server.requests[1]


@pytest.mark.asyncio
async def test_rate_limit_is_retried_after_the_servers_wait(server: FakeOpenAI) -> None:
    server.push(HttpError(429, "slow down", headers={"Retry-After": "0.3"}), Reply("ok"))
    async with client(server, backoff_max_s=1.0) as llm:
        started = time.monotonic()
        reply = await llm.complete(MESSAGES)
    assert reply.attempts == 2 and reply.text == "ok"
    assert time.monotonic() - started >= 0.3


@pytest.mark.asyncio
async def test_a_timeout_is_retried(server: FakeOpenAI) -> None:
    server.push(Delay(60.0), Reply("in time"))
    async with client(server, timeout_s=2.0) as llm:  # room for a busy host's replies
        started = time.monotonic()
        reply = await llm.complete(MESSAGES)
    assert reply.text == "in time"
    assert reply.attempts == 2
    assert 2.0 <= time.monotonic() - started < 30  # gave up long before the delayed answer


@pytest.mark.asyncio
async def test_a_dropped_connection_is_retried(server: FakeOpenAI) -> None:
    server.push(Drop(), Reply("reconnected"))
    async with client(server) as llm:
        reply = await llm.complete(MESSAGES)
    assert (reply.text, reply.attempts) == ("reconnected", 2)


@pytest.mark.asyncio
async def test_errors_every_time_end_in_llm_failed(server: FakeOpenAI) -> None:
    server.push(HttpError(503), HttpError(500), HttpError(502, "bad gateway"))
    async with client(server, max_attempts=3) as llm:
        with pytest.raises(LlmFailed) as failed:
            await llm.complete(MESSAGES)
    assert failed.value.attempts == 3
    assert failed.value.reason == "http_502"
    assert "bad gateway" in failed.value.message
    assert [e.split(": ")[1] for e in failed.value.errors] == ["http_503", "http_500", "http_502"]
    assert len(server.requests) == 3  # the SDK retried nothing on its own
    assert server.unscripted == 0


@pytest.mark.asyncio
async def test_timeouts_every_time_end_in_llm_failed(server: FakeOpenAI) -> None:
    server.push(Delay(2.0), Delay(2.0))
    async with client(server, timeout_s=0.3, max_attempts=2) as llm:
        with pytest.raises(LlmFailed) as failed:
            await llm.complete(MESSAGES)
    assert (failed.value.reason, failed.value.attempts) == ("timeout", 2)
    assert len(server.requests) == 2


@pytest.mark.asyncio
async def test_a_reply_that_is_not_a_completion_is_retried_then_fails(server: FakeOpenAI) -> None:
    server.push(Raw(b"<html>gateway</html>", content_type="text/html"), Reply("fine"))
    server.push(Raw(b'{"choices": "none"}'), Raw(b"[]"), Raw(b'{"choices": [{"message": "x"}]}'))
    async with client(server) as llm:
        reply = await llm.complete(MESSAGES)
        assert (reply.text, reply.attempts) == ("fine", 2)
        with pytest.raises(LlmFailed) as failed:
            await llm.complete(MESSAGES)
    assert (failed.value.reason, failed.value.attempts) == ("malformed_reply", 3)
    assert len(server.requests) == 5


@pytest.mark.asyncio
async def test_a_client_error_is_not_retried(server: FakeOpenAI) -> None:
    server.push(HttpError(401, "invalid api key"), Reply("never sent"))
    async with client(server) as llm:
        with pytest.raises(LlmFailed) as failed:
            await llm.complete(MESSAGES)
    assert (failed.value.reason, failed.value.attempts) == ("http_401", 1)
    assert "invalid api key" in str(failed.value)
    assert len(server.requests) == 1


@pytest.mark.asyncio
async def test_an_endpoint_that_is_down_fails_with_connection() -> None:
    with FakeOpenAI() as gone:
        url = gone.base_url
    cfg = LlmConfig(base_url=url, model="m", max_attempts=2, backoff_base_s=0.01, timeout_s=1.0)
    async with LlmClient(cfg, api_key="k") as llm:
        with pytest.raises(LlmFailed) as failed:
            await llm.complete(MESSAGES)
    assert (failed.value.reason, failed.value.attempts) == ("connection", 2)


def test_backoff_grows_exponentially_with_bounded_jitter(server: FakeOpenAI) -> None:
    llm = LlmClient(config(server, backoff_base_s=1.0, backoff_max_s=5.0, jitter=0.5), api_key="k")
    for failures, base in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)]:
        waits = [llm.backoff_s(failures) for _ in range(50)]
        assert all(base <= w < base * 1.5 for w in waits)
        assert len(set(waits)) > 1  # jittered


def test_a_missing_key_is_a_clear_error_unless_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KF_TEST_KEY", raising=False)
    remote = LlmConfig(base_url="https://api.example.com/v1", model="m", api_key_env="KF_TEST_KEY")
    with pytest.raises(LlmConfigError, match="KF_TEST_KEY is not set"):
        resolve_api_key(remote)
    assert resolve_api_key(remote, api_key="dummy") == "dummy"
    local = LlmConfig(base_url="http://localhost:8000/v1", model="m", api_key_env="KF_TEST_KEY")
    assert resolve_api_key(local) == LOCAL_PLACEHOLDER_KEY
    monkeypatch.setenv("KF_TEST_KEY", "sk-from-env")
    assert resolve_api_key(remote) == "sk-from-env"


@pytest.mark.asyncio
async def test_the_key_from_the_environment_is_sent(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KF_TEST_KEY", "sk-env-123")
    server.push(Reply("hi"))
    cfg = LlmConfig(base_url=server.base_url, model="m", api_key_env="KF_TEST_KEY")
    async with LlmClient(cfg) as llm:
        await llm.complete(MESSAGES)
    assert server.auth_headers == ["Bearer sk-env-123"]


@pytest.mark.asyncio
async def test_a_body_labelled_json_that_is_not_json_is_a_malformed_reply(
    server: FakeOpenAI,
) -> None:
    server.push(Raw(b"this is not JSON"), Reply("fine"))
    async with client(server) as llm:
        reply = await llm.complete(MESSAGES)
    assert (reply.text, reply.attempts) == ("fine", 2)


@pytest.mark.asyncio
async def test_tool_calls_come_back_and_their_answers_go_out(server: FakeOpenAI) -> None:
    server.push(ToolCalls((("compile", {"source": "int x;"}), ("read_lessons", "{}"))))
    server.push(Reply("done"))
    tools: list[Any] = [
        {"type": "function", "function": {"name": "compile", "parameters": {"type": "object"}}}
    ]
    async with client(server) as llm:
        first = await llm.complete(MESSAGES, tools)
        assert first.tool_calls == (
            ToolCall("call_0", "compile", '{"source": "int x;"}'),
            ToolCall("call_1", "read_lessons", "{}"),
        )
        answers = [
            {"role": "tool", "tool_call_id": c.id, "content": f"answer to {c.name}"}
            for c in first.tool_calls
        ]
        assistant = {"role": "assistant", "content": None, "tool_calls": first.tool_calls}
        await llm.complete([*MESSAGES, assistant, *answers], tools)
    sent = server.requests[1]
    assert sent["tools"] == tools and sent["tool_choice"] == "auto"
    assert sent["messages"][-3]["tool_calls"][0]["function"] == {
        "name": "compile",
        "arguments": '{"source": "int x;"}',
    }
    assert sent["messages"][-2:] == [
        {"role": "tool", "tool_call_id": "call_0", "content": "answer to compile"},
        {"role": "tool", "tool_call_id": "call_1", "content": "answer to read_lessons"},
    ]


@pytest.mark.asyncio
async def test_messages_with_an_unknown_role_are_refused(server: FakeOpenAI) -> None:
    async with client(server) as llm:
        with pytest.raises(ValueError, match="role"):
            await llm.complete([{"role": "robot", "content": "x"}])
    assert server.requests == []
