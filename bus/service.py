"""Request/reply over the NATS micro services API (discoverable with `nats micro ls`).

Each request is answered in a task of its own, so a slow request never holds the others.
While an endpoint runs, `asker()` names who asked: the user whose inbox the reply goes to
(`_INBOX.<public key>`: `bus/auth.py` gives each user an inbox only it may subscribe to,
so one who names another's inbox never reads the answer). A service shares its work
fairly among askers by it (`eventstore/fair_pool.py`).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
import structlog
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import EndpointConfig, Service

from bus.subjects import service_subject

log = structlog.get_logger("bus.service")

__all__ = [
    "NoAnswer",
    "NoResponder",
    "RequestRefused",
    "Service",
    "ServiceError",
    "asked",
    "asker",
    "request",
    "serve",
]

Endpoint = Callable[[bytes], Awaitable[bytes]]

ERROR_HEADER = "Nats-Service-Error"
ERROR_CODE_HEADER = "Nats-Service-Error-Code"

_asker: contextvars.ContextVar[str] = contextvars.ContextVar("asker", default="")


R = TypeVar("R")


def asked(data: bytes, kind: type[R]) -> R:
    """A request's body decoded as `kind`; RequestRefused (400) when it is not one."""
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError as exc:
        raise RequestRefused(f"bad request: {exc}") from exc


def asker() -> str:
    """Who asked the request being answered: the user part of its reply inbox
    (`_INBOX.<public key>`), the whole reply subject for another inbox, "" for none."""
    return _asker.get()


def _asker_of(reply: str) -> str:
    parts = reply.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "_INBOX" else reply


class ServiceError(RuntimeError):
    """The service answered with an error (`code` follows HTTP conventions)."""

    def __init__(self, code: int, description: str) -> None:
        super().__init__(description)
        self.code = code


class NoResponder(ConnectionError):
    """Nobody serves this endpoint on the bus."""


class NoAnswer(TimeoutError):
    """The service did not answer in time."""


class RequestRefused(Exception):
    """Raised by an endpoint to answer with an error code (400 unless said) and a clear
    description."""

    def __init__(self, description: str, code: int = 400) -> None:
        super().__init__(description)
        self.code = code


async def serve(
    nc: Client, name: str, version: str, endpoints: dict[str, Endpoint], description: str = ""
) -> Service:
    """Start a micro service whose endpoints answer on `kf.svc.<name>.<endpoint>`."""
    service = await add_service(nc, name=name, version=version, description=description)
    for endpoint, handler in endpoints.items():
        await service.add_endpoint(
            EndpointConfig(
                name=endpoint,
                subject=service_subject(name, endpoint),
                handler=_responder(handler),
            )
        )
    return service


def _responder(handler: Endpoint) -> Callable[[Request], Awaitable[None]]:
    running: set[asyncio.Task[None]] = set()

    async def dispatch(request: Request) -> None:
        task = asyncio.create_task(answer(request))
        running.add(task)
        task.add_done_callback(running.discard)

    async def answer(request: Request) -> None:
        try:
            await respond(request)
        except Exception as exc:  # the requester left, or the connection closed
            log.warning("could not answer a request", error=str(exc))

    async def respond(request: Request) -> None:
        _asker.set(_asker_of(request._msg.reply or ""))  # its own task: its own context
        try:
            reply = await handler(request.data)
        except RequestRefused as exc:
            await request.respond_error(str(exc.code), str(exc))
            return
        except Exception as exc:
            log.exception("service endpoint failed")
            await request.respond_error("500", f"{type(exc).__name__}: {exc}")
            return
        await request.respond(reply)

    return dispatch


async def request(
    nc: Client, service: str, endpoint: str, data: bytes, timeout: float = 10.0
) -> bytes:
    """Ask a service; raises ServiceError when it answers with an error."""
    try:
        reply = await nc.request(service_subject(service, endpoint), data, timeout=timeout)
    except NoRespondersError as exc:
        raise NoResponder(f"nobody serves {service}.{endpoint}") from exc
    except NatsTimeout as exc:
        raise NoAnswer(f"{service}.{endpoint} did not answer within {timeout:g} s") from exc
    headers = reply.headers or {}
    if ERROR_HEADER in headers:
        raise ServiceError(int(headers.get(ERROR_CODE_HEADER, "500")), headers[ERROR_HEADER])
    return reply.data
