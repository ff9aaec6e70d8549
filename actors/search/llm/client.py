"""One chat completion from any OpenAI-compatible endpoint, with timeouts and counted retries.

The SDK's own retries are off (`max_retries=0`): every attempt is made and counted here,
so the attempts recorded in an event are the requests the endpoint really received.
With `tools` (function definitions as the API takes them) the reply may carry tool calls
(`LlmReply.tool_calls`), and the messages may hold the assistant's earlier calls and the
`role: "tool"` answers to them.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Final
from urllib.parse import urlsplit

import msgspec
import openai
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageFunctionToolCallParam,
    ChatCompletionMessageParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionUserMessageParam,
)

from actors.campaign.campaign_file import Writer

LOCAL_HOSTS: Final = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})
LOCAL_PLACEHOLDER_KEY: Final = "kfactory-local-no-key"
"""Sent to a local endpoint when no key is configured; local servers ignore it."""


class LlmConfigError(Exception):
    """The client cannot be built as configured (e.g. the key's variable is unset)."""


class LlmFailed(Exception):
    """No usable reply: `reason` is a short code, `attempts` the requests actually sent."""

    def __init__(self, reason: str, message: str, attempts: int, errors: tuple[str, ...]):
        super().__init__(f"{reason} after {attempts} attempt(s): {message}")
        self.reason = reason
        self.message = message
        self.attempts = attempts
        self.errors = errors
        """One line per failed attempt, in order."""


class LlmConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Where the endpoint is and how patiently to talk to it."""

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 120.0
    """Per request (one attempt), not for the whole call."""
    max_attempts: int = 4
    backoff_base_s: float = 1.0
    """The wait after the first failure; it doubles after each further one."""
    backoff_max_s: float = 30.0
    jitter: float = 0.5
    """Each wait is stretched by a random fraction in [0, jitter)."""
    temperature: float | None = None
    max_tokens: int | None = None

    @classmethod
    def of(cls, writer: Writer) -> LlmConfig:
        """The campaign's `[writer]` endpoint and its patience."""
        return cls(
            base_url=writer.base_url or "",
            model=writer.model or "",
            api_key_env=writer.api_key_env,
            timeout_s=writer.timeout_s,
            max_attempts=writer.attempts,
            backoff_base_s=writer.backoff_s,
        )


class ToolCall(msgspec.Struct, frozen=True):
    """A tool call in a reply: its id, the function's name and its arguments (JSON text as
    the model wrote it: not checked here)."""

    id: str
    name: str
    arguments: str


class LlmReply(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    usage: dict[str, int]
    """prompt_tokens, completion_tokens, total_tokens (as the endpoint reported them)."""
    attempts: int
    latency_s: float
    """Wall time of the whole call, waits between attempts included."""
    model: str
    """The model the endpoint says answered."""
    finish_reason: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


def is_local(base_url: str) -> bool:
    return (urlsplit(base_url).hostname or "") in LOCAL_HOSTS


def resolve_api_key(config: LlmConfig, api_key: str | None = None) -> str:
    """An explicit key, else the configured variable, else a placeholder for local endpoints."""
    if api_key is not None:
        return api_key
    found = os.environ.get(config.api_key_env, "")
    if found:
        return found
    if is_local(config.base_url):
        return LOCAL_PLACEHOLDER_KEY
    raise LlmConfigError(
        f"environment variable {config.api_key_env} is not set; it must hold the API key "
        f"for {config.base_url} (or set writer.api_key_env to the variable that does)"
    )


def _typed_message(message: Mapping[str, Any]) -> ChatCompletionMessageParam:
    role, content = message.get("role"), message.get("content")
    calls = message.get("tool_calls") or ()
    if role == "assistant" and calls:
        return ChatCompletionAssistantMessageParam(
            role="assistant",
            content=content if isinstance(content, str) else None,
            tool_calls=[
                ChatCompletionMessageFunctionToolCallParam(
                    id=call.id,
                    type="function",
                    function={"name": call.name, "arguments": call.arguments},
                )
                for call in calls
            ],
        )
    if not isinstance(content, str):
        raise ValueError(f"chat message without content: {dict(message)}")
    if role == "system":
        return ChatCompletionSystemMessageParam(role="system", content=content)
    if role == "user":
        return ChatCompletionUserMessageParam(role="user", content=content)
    if role == "assistant":
        return ChatCompletionAssistantMessageParam(role="assistant", content=content)
    if role == "tool":
        return ChatCompletionToolMessageParam(
            role="tool", content=content, tool_call_id=str(message.get("tool_call_id", ""))
        )
    raise ValueError(f"chat message role must be system, user, assistant or tool, got {role!r}")


class _Retryable(Exception):
    def __init__(self, reason: str, detail: str, retry_after_s: float | None = None):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.retry_after_s = retry_after_s


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date; the backoff applies instead


def _status_detail(error: openai.APIStatusError) -> str:
    return f"HTTP {error.status_code}: {error.message}".splitlines()[0][:500]


class LlmClient:
    """`await client.complete(messages)` -> LlmReply, or LlmFailed with the reason."""

    def __init__(
        self, config: LlmConfig, *, api_key: str | None = None, rng: random.Random | None = None
    ) -> None:
        if config.max_attempts < 1:
            raise LlmConfigError("max_attempts must be at least 1")
        self.config = config
        self._rng = rng or random.Random()
        self._sdk = openai.AsyncOpenAI(
            api_key=resolve_api_key(config, api_key),
            base_url=config.base_url,
            timeout=config.timeout_s,
            max_retries=0,
        )

    async def __aenter__(self) -> LlmClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._sdk.close()

    def backoff_s(self, failures: int, retry_after_s: float | None = None) -> float:
        """The wait after `failures` failed attempts (1, 2, ...)."""
        c = self.config
        wait = min(c.backoff_max_s, c.backoff_base_s * 2 ** (failures - 1))
        wait *= 1.0 + c.jitter * self._rng.random()
        if retry_after_s is not None:
            wait = max(wait, min(retry_after_s, c.backoff_max_s))
        return wait

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[ChatCompletionFunctionToolParam] = (),
    ) -> LlmReply:
        """The reply to `messages` (an assistant message may carry `tool_calls`, a list of
        `ToolCall`; a tool's answer is `{"role": "tool", "tool_call_id", "content"}`)."""
        typed = [_typed_message(m) for m in messages]
        started = time.monotonic()
        errors: list[str] = []
        last_reason = last_detail = ""
        for attempt in range(1, self.config.max_attempts + 1):
            try:
                reply = await self._attempt(typed, list(tools))
            except _Retryable as failure:
                errors.append(f"attempt {attempt}: {failure.reason}: {failure.detail}")
                last_reason, last_detail = failure.reason, failure.detail
                if attempt < self.config.max_attempts:
                    await asyncio.sleep(self.backoff_s(attempt, failure.retry_after_s))
                continue
            except openai.APIStatusError as error:  # 4xx other than 408/409/429: no retry
                detail = _status_detail(error)
                errors.append(f"attempt {attempt}: http_{error.status_code}: {detail}")
                raise LlmFailed(
                    f"http_{error.status_code}", detail, attempt, tuple(errors)
                ) from error
            text, usage, model, finish, calls = reply
            return LlmReply(
                text=text,
                usage=usage,
                attempts=attempt,
                latency_s=time.monotonic() - started,
                model=model,
                finish_reason=finish,
                tool_calls=calls,
            )
        raise LlmFailed(last_reason, last_detail, self.config.max_attempts, tuple(errors))

    async def _attempt(
        self,
        messages: list[ChatCompletionMessageParam],
        tools: list[ChatCompletionFunctionToolParam],
    ) -> tuple[str, dict[str, int], str, str, tuple[ToolCall, ...]]:
        c = self.config
        extra: dict[str, Any] = {}
        if tools:
            extra["tools"] = tools
            extra["tool_choice"] = "auto"
        if c.temperature is not None:
            extra["temperature"] = c.temperature
        if c.max_tokens is not None:
            extra["max_tokens"] = c.max_tokens
        try:
            completion = await self._sdk.chat.completions.create(
                model=c.model, messages=messages, timeout=c.timeout_s, **extra
            )
        except openai.APITimeoutError as error:
            raise _Retryable("timeout", f"no reply within {c.timeout_s:g} s") from error
        except openai.APIConnectionError as error:
            raise _Retryable("connection", str(error).splitlines()[0][:500]) from error
        except openai.APIStatusError as error:
            status = error.status_code
            if status in (408, 409, 429) or status >= 500:
                after = _retry_after(error.response.headers)
                raise _Retryable(f"http_{status}", _status_detail(error), after) from error
            raise
        except openai.APIError as error:  # e.g. a body the SDK could not validate
            raise _Retryable("malformed_reply", str(error).splitlines()[0][:500]) from error
        except ValueError as error:  # a body that claims to be JSON and is not
            raise _Retryable("malformed_reply", f"the body is not JSON: {error}") from error
        return _parse(completion, c.model)


def _parse(
    completion: object, asked_model: str
) -> tuple[str, dict[str, int], str, str, tuple[ToolCall, ...]]:
    """Text, usage, model, finish reason and tool calls of a reply, checked field by field.

    The SDK builds its objects without validation, so an endpoint that answers 200 with
    something else gives strings or dicts in odd places; that is a malformed reply.
    """
    choices = getattr(completion, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise _Retryable("malformed_reply", f"the reply carried no choices: {completion!r:.200}")
    message = getattr(choices[0], "message", None)
    text = getattr(message, "content", None)
    if not hasattr(message, "content") or not isinstance(text, str | None):
        raise _Retryable("malformed_reply", f"the first choice has no message: {choices[0]!r:.200}")
    usage: dict[str, int] = {}
    reported = getattr(completion, "usage", None)
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = getattr(reported, name, None)
        if isinstance(value, int):
            usage[name] = value
    model = getattr(completion, "model", None)
    finish = getattr(choices[0], "finish_reason", None)
    return (
        text or "",
        usage,
        model if isinstance(model, str) and model else asked_model,
        finish if isinstance(finish, str) else "",
        _tool_calls(getattr(message, "tool_calls", None)),
    )


def _tool_calls(found: object) -> tuple[ToolCall, ...]:
    """The reply's tool calls; a call without an id, a function name or text arguments
    makes the reply malformed."""
    if found is None:
        return ()
    if not isinstance(found, list):
        raise _Retryable("malformed_reply", f"tool_calls is not a list: {found!r:.200}")
    calls = []
    for call in found:
        function = getattr(call, "function", None)
        ident = getattr(call, "id", None)
        name = getattr(function, "name", None)
        arguments = getattr(function, "arguments", None)
        if not (isinstance(ident, str) and isinstance(name, str) and isinstance(arguments, str)):
            raise _Retryable("malformed_reply", f"a tool call is malformed: {call!r:.200}")
        calls.append(ToolCall(ident, name, arguments))
    return tuple(calls)
