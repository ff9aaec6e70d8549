"""Subject names on the bus: `kf.ev.<campaign>.<type>[.<target>]`.

Campaign ids, event types and targets are single subject tokens: letters, digits,
`_`, `-` and `:` only, so no id can smuggle in a dot, a space or a wildcard. A campaign
id is narrower still (`check_campaign_id`): letters, digits, `_` and `-`, at most 64,
checked wherever one enters (the campaign file and flags, the CLI, every event admitted).
"""

from __future__ import annotations

import re

STREAM = "KF_EVENTS"
EVENTS_PREFIX = "kf.ev"
ALL_EVENTS = f"{EVENTS_PREFIX}.>"
SERVICE_PREFIX = "kf.svc"

_TOKEN = re.compile(r"[A-Za-z0-9_:-]{1,128}")
_CAMPAIGN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_CAMPAIGN_ID = 64


class SubjectError(ValueError):
    """A name that cannot be used as a subject token."""


def check_token(value: str, what: str = "token") -> str:
    """Return `value` if it is a safe subject token, else raise a clear error."""
    if not _TOKEN.fullmatch(value):
        raise SubjectError(
            f"invalid {what} {value!r}: use 1-128 letters, digits, '_', '-' or ':' "
            "(no dots, spaces or wildcards)"
        )
    return value


def is_campaign_id(value: object) -> bool:
    return isinstance(value, str) and _CAMPAIGN_ID.fullmatch(value) is not None


def check_campaign_id(value: str, what: str = "campaign id") -> str:
    """Return `value` if it is a safe campaign id (letters, digits, `_`, `-`; at most 64)."""
    if not is_campaign_id(value):
        raise SubjectError(
            f"invalid {what} {value!r}: use 1-{MAX_CAMPAIGN_ID} letters, digits, '_' or '-'"
        )
    return value


def event_subject(campaign_id: str, event_type: str, target: str | None = None) -> str:
    parts = [EVENTS_PREFIX, check_campaign_id(campaign_id), check_token(event_type)]
    if target:
        parts.append(check_token(target, "target"))
    return ".".join(parts)


def type_filters(event_types: list[str], target: str | None = None) -> list[str]:
    """Stream filters matching these event types in any campaign (and one target if given)."""
    filters: list[str] = []
    for event_type in event_types:
        base = f"{EVENTS_PREFIX}.*.{check_token(event_type)}"
        if target:
            filters.append(f"{base}.{check_token(target, 'target')}")
        else:
            filters += [base, f"{base}.>"]
    return filters


def campaign_filter(campaign_id: str | None) -> str:
    if campaign_id is None:
        return ALL_EVENTS
    return f"{EVENTS_PREFIX}.{check_campaign_id(campaign_id)}.>"


def parse_event_subject(subject: str) -> tuple[str, str, str | None] | None:
    """(campaign, type, target) of an event subject, or None if it is not one."""
    parts = subject.split(".")
    if len(parts) not in (4, 5) or ".".join(parts[:2]) != EVENTS_PREFIX:
        return None
    if not all(_TOKEN.fullmatch(p) for p in parts[2:]):
        return None
    return parts[2], parts[3], parts[4] if len(parts) == 5 else None


def service_subject(service: str, endpoint: str) -> str:
    return f"{SERVICE_PREFIX}.{check_token(service)}.{check_token(endpoint)}"
