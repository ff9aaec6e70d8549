"""Checking the record itself: the hash chain over the exact stored bytes, gap-free
positions, columns that say what their payload says, and an exported head.

Each break is named by position, with what it looks like: an edited payload, an event
inserted or removed, two events swapped, or a tail cut off after an anchor.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from eventstore.claims import Claim, agrees, differs
from eventstore.snapshot import StoredRow
from eventstore.store import GENESIS, chain_hash

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
    while index < len(rows) and len(breaks) < MAX_BREAKS:
        row = rows[index]
        if chain_hash(row.payload, previous) == row.chain_hash:
            before_previous, previous = previous, row.chain_hash
            index += 1
            continue
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
    return [
        agrees(
            "chain",
            f"hash chain of {campaign_id}",
            f"{len(rows)} events re-hashed over their stored bytes; head {head}",
        )
    ]


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
    if nxt is not None and chain_hash(nxt.payload, previous) == nxt.chain_hash:
        if chain_hash(row.payload, nxt.chain_hash) == row.chain_hash:
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
    if i >= 1 and chain_hash(row.payload, before_previous) == row.chain_hash:
        earlier = rows[i - 1]
        return differs(
            "chain",
            name,
            f"an event was inserted at position {earlier.position} ({earlier.type} "
            f"{earlier.event_id}): position {row.position} chains from the one before it",
            earlier.position,
        ), 1
    if nxt is not None and chain_hash(nxt.payload, row.chain_hash) == nxt.chain_hash:
        return differs(
            "chain",
            name,
            f"the payload at position {row.position} ({row.type} {row.event_id}) was edited "
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
    """The queryable columns (not hashed) must say what the hashed payload says."""
    bad: list[int] = []
    for row in rows:
        try:
            head = msgspec.json.decode(row.payload, type=_Head)
        except msgspec.DecodeError:
            bad.append(row.position)
            continue
        if (head.event_id, head.campaign_id, head.type, head.actor.role) != (
            row.event_id,
            row.campaign_id,
            row.type,
            row.actor_role,
        ):
            bad.append(row.position)
    if bad:
        return differs(
            "columns",
            "columns match payloads",
            f"id, campaign, type or role disagree with the payload at {_listed(bad)}",
            bad[0],
        )
    return agrees("columns", "columns match payloads", f"{len(rows)} rows")


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


class _Head(msgspec.Struct):
    event_id: str
    campaign_id: str
    type: str
    actor: _Actor


def _listed(positions: list[int]) -> str:
    shown = ", ".join(str(p) for p in positions[:10])
    more = f" and {len(positions) - 10} more" if len(positions) > 10 else ""
    return f"position{'s' if len(positions) > 1 else ''} {shown}{more}"
