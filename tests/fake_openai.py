"""A local server that speaks the OpenAI chat-completions API over a real socket.

It records every request body and answers from a scripted queue of behaviours:
`Reply(text)`, `ToolCalls(calls)` (an assistant message that calls tools; the client's
`role: "tool"` answers arrive in the next request's messages), `HttpError(status)`,
`Delay(seconds)` (answers only after the client gave up), `Raw(body)` and `Drop()`
(closes the connection without a response).

    with FakeOpenAI([HttpError(500), Reply("```c ... ```")]) as server:
        LlmConfig(base_url=server.base_url, model="fake", ...)
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Reply:
    text: str
    prompt_tokens: int = 11
    completion_tokens: int = 7
    finish_reason: str = "stop"


@dataclass(frozen=True)
class ToolCalls:
    """An assistant message calling tools: (name, arguments) pairs, the arguments a dict
    (sent as JSON text) or any text as it is."""

    calls: tuple[tuple[str, dict[str, Any] | str], ...]
    text: str | None = None
    prompt_tokens: int = 11
    completion_tokens: int = 7


@dataclass(frozen=True)
class HttpError:
    status: int
    message: str = "scripted failure"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Delay:
    """Sleep, then answer with `then` (a client with a shorter timeout has left by then)."""

    seconds: float
    then: Reply = field(default_factory=lambda: Reply("too late"))


@dataclass(frozen=True)
class Raw:
    """Any body with any status: for replies that are not what the API promises."""

    body: bytes
    status: int = 200
    content_type: str = "application/json"


@dataclass(frozen=True)
class Drop:
    """Close the connection without sending anything."""


Behaviour = Reply | ToolCalls | HttpError | Delay | Raw | Drop


class FakeOpenAI:
    def __init__(self, script: Iterable[Behaviour] = ()) -> None:
        self._script: deque[Behaviour] = deque(script)
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.requests: list[dict[str, Any]] = []
        """Every request body received, parsed, in arrival order."""
        self.paths: list[str] = []
        self.auth_headers: list[str] = []
        self.unscripted = 0
        """Requests that arrived after the script ran out (answered with HTTP 599)."""
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self._script.extend(behaviours)

    def start(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _next(self, body: dict[str, Any], path: str, auth: str) -> Behaviour | None:
        with self._lock:
            self.requests.append(body)
            self.paths.append(path)
            self.auth_headers.append(auth)
            if not self._script:
                self.unscripted += 1
                return None
            return self._script.popleft()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                behaviour = server._next(body, self.path, self.headers.get("Authorization", ""))
                if not self.path.endswith("/chat/completions"):
                    self._json(404, _error(f"no route {self.path}", "not_found"))
                elif behaviour is None:
                    self._json(599, _error("the fake server's script ran out", "unscripted"))
                elif isinstance(behaviour, Reply | ToolCalls):
                    self._json(200, _completion(behaviour, str(body.get("model", ""))))
                elif isinstance(behaviour, HttpError):
                    payload = _error(behaviour.message, f"http_{behaviour.status}")
                    self._json(behaviour.status, payload, behaviour.headers)
                elif isinstance(behaviour, Delay):
                    if server._closing.wait(behaviour.seconds):
                        return
                    with contextlib.suppress(OSError):  # the client gave up, as intended
                        self._json(200, _completion(behaviour.then, str(body.get("model", ""))))
                elif isinstance(behaviour, Raw):
                    self._send(behaviour.status, behaviour.body, behaviour.content_type)
                else:
                    self.close_connection = True  # Drop: no status line at all

            def _json(
                self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                self._send(status, json.dumps(payload).encode(), "application/json", headers)

            def _send(
                self,
                status: int,
                data: bytes,
                content_type: str,
                headers: dict[str, str] | None = None,
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _completion(reply: Reply | ToolCalls, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    finish = "tool_calls"
    if isinstance(reply, ToolCalls):
        message["tool_calls"] = [
            {
                "id": f"call_{number}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
            for number, (name, arguments) in enumerate(reply.calls)
        ]
    else:
        finish = reply.finish_reason
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model or "fake-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish,
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "fake_error", "code": code, "param": None}}
