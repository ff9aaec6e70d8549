"""Bytes <-> events. `encode` gives an event's canonical form (msgspec's compact JSON):
the recorder re-encodes every event it accepts, and the store keeps exactly those bytes
and hashes them into the chain.

`decode` raises only `InvalidEvent`, whatever the bytes: size and nesting depth are
checked before parsing. Old schemas are upgraded on read by upcasters registered per
(type, schema).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import accumulate
from typing import Any

import msgspec

from eventstore.events import EVENT_TYPES, MAX_EVENT_BYTES, AnyEvent, BenchmarkCompleted, Event

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyEvent)

#: No event nests deeper than this; deeper JSON is refused before it is parsed.
MAX_DEPTH = 32

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class InvalidEvent(ValueError):
    """Bytes that do not decode to a known, complete event."""


class Upcasters:
    """Functions that lift a raw event dict from schema N to N+1, per event type."""

    def __init__(self) -> None:
        self._steps: dict[tuple[str, int], Upcaster] = {}

    def register(self, event_type: str, from_schema: int) -> Callable[[Upcaster], Upcaster]:
        def add(step: Upcaster) -> Upcaster:
            self._steps[(event_type, from_schema)] = step
            return step

        return add

    def upcast(self, raw: dict[str, Any]) -> dict[str, Any]:
        event_type = raw.get("type")
        cls = EVENT_TYPES.get(event_type) if isinstance(event_type, str) else None
        if cls is None:
            return raw
        schema = raw.get("schema", 1)
        while isinstance(schema, int) and schema < cls.SCHEMA:
            step = self._steps.get((cls.__name__, schema))
            if step is None:
                raise InvalidEvent(f"no upcaster for {cls.__name__} schema {schema}")
            raw = {**step(raw), "schema": schema + 1}
            schema += 1
        return raw


UPCASTERS = Upcasters()

#: The facts BenchmarkCompleted schema 1 kept in `evidence`, by schema 2's field names.
SCHEMA_1_TIMING_FACTS = {
    "shape": "shape",
    "q1_ns": "q1_ns",
    "q3_ns": "q3_ns",
    "runs": "samples",
    "baseline_iqr_ns": "baseline_iqr_ns",
    "roofline_ns": "roofline_ns",
    "incumbent": "incumbent",
    "speedup_vs_incumbent": "speedup_vs_incumbent",
    "head_to_head": "head_to_head",
    "host_contention_cores": "host_contention_cores",
    "timing_attempts": "timing_attempts",
}


@UPCASTERS.register("BenchmarkCompleted", 1)
def _timing_facts_out_of_evidence(raw: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 -> 2: each timing fact moves from `evidence` to its own field. A value the
    field's type refuses (a forged one: no benchmarker wrote it) stays in `evidence`,
    where no reader looks, and the field keeps its default, so the event still decodes."""
    evidence = raw.get("evidence")
    if not isinstance(evidence, dict):
        return raw
    kept = dict(evidence)
    types = {f.encode_name: f.type for f in msgspec.structs.fields(BenchmarkCompleted)}
    lifted: dict[str, Any] = {}
    for old, new in SCHEMA_1_TIMING_FACTS.items():
        if old not in kept or kept[old] is None:
            kept.pop(old, None)
            continue
        try:
            msgspec.convert(kept[old], types[new])
        except msgspec.ValidationError:
            continue
        lifted[new] = kept.pop(old)
    return {**raw, **lifted, "evidence": kept}


def encode(event: Event) -> bytes:
    data = _encoder.encode(event)
    if len(data) > MAX_EVENT_BYTES:
        raise InvalidEvent(
            f"{event.type} is {len(data)} bytes, over the {MAX_EVENT_BYTES}-byte event cap"
        )
    return data


def check_limits(data: bytes) -> None:
    """Refuse bytes too big or nested too deep to parse safely (before any parsing)."""
    if len(data) > MAX_EVENT_BYTES:
        raise InvalidEvent(f"{len(data)} bytes, over the {MAX_EVENT_BYTES}-byte cap")
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return  # cannot be deeper than its number of brackets
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = max(accumulate(_STEP[b] for b in brackets), default=0)
    if depth > MAX_DEPTH:
        raise InvalidEvent(f"JSON nested {depth} deep, over the limit of {MAX_DEPTH}")


def decode(data: bytes, upcasters: Upcasters = UPCASTERS) -> Event:
    """Decode one event, upgrading an old schema; raises InvalidEvent (only) with the reason."""
    check_limits(data)
    try:
        try:
            event: Event = _decoder.decode(data)
        except msgspec.DecodeError as exc:
            return _decode_slow(data, exc, upcasters)
        if event.schema != type(event).SCHEMA:
            return _decode_slow(data, None, upcasters)
        return event
    except InvalidEvent:
        raise
    except Exception as exc:  # anything else hostile bytes can provoke is a rejection too
        raise InvalidEvent(f"undecodable: {type(exc).__name__}: {exc}") from exc


def _decode_slow(data: bytes, error: msgspec.DecodeError | None, upcasters: Upcasters) -> Event:
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise InvalidEvent(f"not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidEvent(f"expected a JSON object, got {type(raw).__name__}")
    event_type = raw.get("type")
    if not isinstance(event_type, str) or event_type not in EVENT_TYPES:
        raise InvalidEvent(f"unknown event type {str(event_type)[:100]!r}")
    upgraded = upcasters.upcast(raw)
    if upgraded is raw and error is not None:
        raise InvalidEvent(str(error))
    try:
        event: Event = msgspec.convert(upgraded, AnyEvent)
    except msgspec.ValidationError as exc:
        raise InvalidEvent(str(exc)) from exc
    return event
