"""Events as an older schema recorded them, for the tests that replay old stores."""

from __future__ import annotations

from typing import Any

import msgspec

from eventstore.codec import SCHEMA_1_TIMING_FACTS, encode
from eventstore.events import BenchmarkCompleted


def in_schema_one(timed: BenchmarkCompleted, **evidence: Any) -> bytes:
    """`timed` as BenchmarkCompleted schema 1 recorded it: its timing facts inside
    `evidence` (then `evidence` overrides, such as a forged value, applied)."""
    raw = msgspec.json.decode(encode(timed))
    facts = {old: raw.pop(new) for old, new in SCHEMA_1_TIMING_FACTS.items()}
    raw["evidence"] = {**facts, **raw["evidence"], **evidence}
    raw["schema"] = 1
    return msgspec.json.encode(raw)
