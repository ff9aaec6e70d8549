"""What roles ask each other over request/reply: the librarian's service, its request and
reply structs, and the calls other roles make to it. Roles share this module and never
import one another."""

from __future__ import annotations

from typing import Any

import msgspec

from bus.connection import Client
from bus.service import request

SERVICE = "kf-librarian"


class SeenRequest(msgspec.Struct, frozen=True):
    campaign_id: str
    param_keys: list[str] = []
    source_hash: str | None = None
    candidate_id: str = ""


class SeenReply(msgspec.Struct, frozen=True):
    keys: dict[str, str | None]
    """param key -> the candidate that already has it (evaluated or in flight)."""
    source_duplicate_of: str | None = None
    """The event that settled an earlier candidate with the same kernel source."""


class KernelRequest(msgspec.Struct, frozen=True):
    campaign_id: str
    candidate_id: str | None = None  # None: the campaign's best


class KernelReply(msgspec.Struct, frozen=True):
    candidate_id: str
    source: str
    flags: list[str]
    speedup: float | None = None
    rejection: dict[str, Any] | None = None


class LessonsRequest(msgspec.Struct, frozen=True):
    campaign_id: str


class LessonView(msgspec.Struct, frozen=True):
    kind: str
    statement: str
    data: dict[str, Any]
    evidence_ids: list[str]


async def ask_seen(nc: Client, ask: SeenRequest) -> SeenReply:
    reply = await request(nc, SERVICE, "seen", msgspec.json.encode(ask), timeout=30)
    return msgspec.json.decode(reply, type=SeenReply)


async def ask_kernel(nc: Client, campaign_id: str, candidate_id: str | None) -> KernelReply | None:
    ask = KernelRequest(campaign_id, candidate_id)
    reply = await request(nc, SERVICE, "kernel", msgspec.json.encode(ask), timeout=30)
    return msgspec.json.decode(reply, type=KernelReply | None)


async def ask_lessons(nc: Client, campaign_id: str) -> list[LessonView]:
    ask = LessonsRequest(campaign_id)
    reply = await request(nc, SERVICE, "lessons", msgspec.json.encode(ask), timeout=30)
    return msgspec.json.decode(reply, type=list[LessonView])
