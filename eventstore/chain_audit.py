"""Checking the record itself: the hash chain over the exact stored bytes, gap-free
positions, columns that say what their payload says, and an exported head.

Each break is named by position, with what it looks like: an edited payload, an event
inserted or removed, two events swapped, or a tail cut off after an anchor.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import msgspec

from eventstore.claims import Claim, agrees, differs
from eventstore.events import EVENT_TYPES
from eventstore.snapshot import StoredRow
from eventstore.store import CHAIN_RULE, GENESIS, link_rule

MAX_BREAKS = 20


def missing_positions(positions: Sequence[int]) -> list[int]:
    """Positions absent from 1..max (a deleted event leaves one)."""
    found = set(positions)
    return [p for p in range(1, max(found, default=0) + 1) if p not in found]


def check_positions(positions: Sequence[int]) -> Claim:
    """Positions are global and gap-free: 1..n, each once."""
    missing: list[int] = []
    repeated: list[int] = []
    expected = 1
    for position in positions:
        if position < expected:
            repeated.append(position)
            continue
        missing.extend(range(expected, min(position, expected + MAX_BREAKS)))
        expected = position + 1
    if missing or repeated:
        parts = []
        if missing:
            parts.append(f"missing {_listed(missing)} (deleted)")
        if repeated:
            parts.append(f"repeated {_listed(repeated)} (inserted)")
        first = min(missing + repeated)
        return differs("chain", "positions gap-free", "; ".join(parts), first)
    return agrees("chain", "positions gap-free", f"1..{len(positions)}, each once")


def check_chain(
    rows: Sequence[StoredRow], campaign_id: str, missing: Sequence[int] = ()
) -> list[Claim]:
    """Re-hash a campaign's stored payloads; one claim per break (or one that agrees).
    `missing` are the store's absent positions, which tell a deletion from an edit."""
    breaks: list[Claim] = []
    previous = GENESIS
    before_previous = GENESIS
    index = 0
    old_rule = 0  # links written before rule 2: their stream_seq is not covered
    covered = False  # a rule-2 link with a sequence was seen: no rule-1 link may follow
    while index < len(rows) and len(breaks) < MAX_BREAKS:
        row = rows[index]
        rule = link_rule(row.payload, previous, row.stream_seq, row.chain_hash)
        covered = covered or (rule == CHAIN_RULE and row.stream_seq is not None)
        if rule == CHAIN_RULE or (rule == 1 and not covered):
            old_rule += rule == 1
            before_previous, previous = previous, row.chain_hash
            index += 1
            continue
        if rule == 1:
            claim, skip = _rule_one_after_rule_two(row), 1
        else:
            claim, skip = _diagnose(rows, index, previous, before_previous, missing)
        breaks.append(claim)
        # Carry on from the stored hashes, so later breaks are found too; after a swap
        # the chain goes on from the pair's later event in the original order.
        resume = rows[index] if skip == 2 else rows[min(index + skip, len(rows)) - 1]
        before_previous, previous = previous, resume.chain_hash
        index += skip
    if breaks:
        return breaks
    head = rows[-1].chain_hash.hex() if rows else GENESIS.hex()
    older = (
        f"; {old_rule} links written before chain rule 2 verified under rule 1 (their "
        "stream_seq is not covered)"
        if old_rule
        else ""
    )
    return [
        agrees(
            "chain",
            f"hash chain of {campaign_id}",
            f"{len(rows)} events re-hashed over their stored bytes and bus sequences; "
            f"head {head}{older}",
        )
    ]


def _rule_one_after_rule_two(row: StoredRow) -> Claim:
    return differs(
        "chain",
        "hash chain",
        f"the stream_seq at position {row.position} ({row.type} {row.event_id}) was edited: "
        "its link reads only under chain rule 1, after links of rule 2",
        row.position,
    )


def _links(row: StoredRow, previous: bytes) -> bool:
    """Whether `row`'s stored hash chains from `previous` (under either rule)."""
    return link_rule(row.payload, previous, row.stream_seq, row.chain_hash) != 0


def _diagnose(
    rows: Sequence[StoredRow],
    i: int,
    previous: bytes,
    before_previous: bytes,
    missing: Sequence[int],
) -> tuple[Claim, int]:
    """Name what a break at rows[i] looks like; and how many rows it accounts for."""
    row = rows[i]
    after = rows[i - 1].position if i >= 1 else 0
    gone = [p for p in missing if after < p < row.position]
    if gone:
        return differs(
            "chain",
            "hash chain",
            f"{_listed(gone)} removed: position {row.position} ({row.type}) chains from an "
            "event that is no longer stored",
            gone[0],
        ), 1
    nxt = rows[i + 1] if i + 1 < len(rows) else None
    name = "hash chain"
    if nxt is not None and _links(nxt, previous):
        if _links(row, nxt.chain_hash):
            return differs(
                "chain",
                name,
                f"events at positions {row.position} and {nxt.position} were swapped",
                row.position,
            ), 2
        return differs(
            "chain",
            name,
            f"an event was inserted at position {row.position} ({row.type} {row.event_id}): "
            "the next event chains from the one before it",
            row.position,
        ), 1
    if i >= 1 and _links(row, before_previous):
        earlier = rows[i - 1]
        return differs(
            "chain",
            name,
            f"an event was inserted at position {earlier.position} ({earlier.type} "
            f"{earlier.event_id}): position {row.position} chains from the one before it",
            earlier.position,
        ), 1
    if nxt is not None and _links(nxt, row.chain_hash):
        return differs(
            "chain",
            name,
            f"the payload or stream_seq at position {row.position} ({row.type} {row.event_id}) "
            "was edited "
            "(it no longer hashes to its stored chain hash), or an event right before it was "
            "removed",
            row.position,
        ), 1
    return differs(
        "chain",
        name,
        f"position {row.position} ({row.type} {row.event_id}) does not chain from the event "
        "before it: that event or this one was altered, or events between them were removed",
        row.position,
    ), 1


def check_columns(rows: Sequence[StoredRow]) -> Claim:
    """Every stored column the chain does not hash must say what the hashed payload says
    (the chain hashes the payload and `stream_seq`)."""
    bad: list[int] = []
    for row in rows:
        try:
            head = msgspec.json.decode(row.payload, type=_Head)
        except (msgspec.DecodeError, msgspec.ValidationError):
            bad.append(row.position)
            continue
        cls = EVENT_TYPES.get(head.type)
        # an old schema's payload is stored as it came; the column may give the schema
        # it is read as (the upcaster's) instead
        schema = row.schema if cls is not None and row.schema == cls.SCHEMA else head.schema
        said = (
            head.event_id,
            head.campaign_id,
            head.type,
            schema,
            head.ts,
            head.actor.role,
            head.actor.instance,
            head.actor.host,
            head.causation_id,
            head.correlation_id,
        )
        stored = (
            row.event_id,
            row.campaign_id,
            row.type,
            row.schema,
            row.ts,
            row.actor_role,
            row.actor_instance,
            row.actor_host,
            row.causation_id,
            row.correlation_id,
        )
        if said != stored:
            bad.append(row.position)
    if bad:
        return differs(
            "columns",
            "columns match payloads",
            "id, campaign, type, schema, time, actor, causation or correlation disagree with "
            f"the payload at {_listed(bad)}",
            bad[0],
        )
    return agrees("columns", "columns match payloads", f"{len(rows)} rows, every column")


def check_anchor(rows: Sequence[StoredRow], campaign_id: str, expected_hex: str) -> Claim:
    """An exported head must still be in the chain; the chain may have grown since.
    `expected_hex` is the hash, or the line `audit --export-head` printed for the
    campaign as it is (`CAMPAIGN<TAB>POSITION<TAB>HASH`): then its campaign and position
    must match too."""
    name = "exported head"
    fields = expected_hex.split()
    expected_hex = fields[-1].lower() if fields else ""
    if len(fields) == 3 and fields[0] != campaign_id:
        return differs("chain", name, f"the head given is {fields[0]}'s, not {campaign_id}'s", None)
    at = int(fields[1]) if len(fields) == 3 and fields[1].isdigit() else None
    last = rows[-1] if rows else None
    for count, row in enumerate(rows, 1):
        if row.chain_hash.hex() == expected_hex and at in (None, row.position):
            since = len(rows) - count
            return agrees(
                "chain",
                name,
                f"found at position {row.position}"
                + (f"; {since} events recorded since" if since else "; it is still the head"),
                row.position,
            )
    end = f"ends at position {last.position}" if last else "is empty"
    return differs(
        "chain",
        name,
        f"{expected_hex[:16]}... is not in the chain of {campaign_id}, which {end}: the tail "
        "after it was truncated, or the chain was rewritten",
        last.position if last else None,
    )


class _Actor(msgspec.Struct):
    role: str
    instance: str
    host: str


class _Head(msgspec.Struct):
    event_id: str
    campaign_id: str
    type: str
    ts: datetime
    actor: _Actor
    schema: int = 1
    causation_id: str | None = None
    correlation_id: str | None = None


def _listed(positions: list[int]) -> str:
    shown = ", ".join(str(p) for p in positions[:10])
    more = f" and {len(positions) - 10} more" if len(positions) > 10 else ""
    return f"position{'s' if len(positions) > 1 else ''} {shown}{more}"
