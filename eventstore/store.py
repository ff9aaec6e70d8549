"""The event store contract, and the sequencing every back end shares.

A store assigns each new event a gap-free global `position` and extends its
campaign's hash chain: `hash_n = sha256(payload_n || LF stream_seq_n || hash_{n-1})`,
starting from 32 zero bytes, where `payload` is the event's canonical bytes
(`codec.encode`), stored and returned verbatim, and `stream_seq` the bus sequence it
arrived with (left out when it has none). Every other stored column is read from the
payload, so the chain covers every column (`chain_audit.check_columns` compares them).
That is chain rule 2; stores written before it hold rule-1 links (`payload || hash`):
`link_rule` tells them apart, and a rule-1 link after a rule-2 link of the same campaign
is a break (an edited sequence cannot pass as an old link).

Appends are idempotent on `event_id`: a batch that collides with a stored event is
sequenced again without the events already known. Back ends
(`memory_store`, `duckdb_store`) only persist and read rows; they pass the same contract
tests (`tests/test_store_contract.py`). `verify_chain` re-hashes what is stored.

`append` commits, with the events, the bus sequence the batch ends at (`stream_cursor`),
so a recorder killed at any instant restarts after its last commit: the "commit, then
ack" rule, with the ack kept in the store, where it cannot drift from the data. Under the
recording lease it also takes the lease's `Fence` (fencing token and scope) and keeps it
beside the cursor; the same write refuses (`FencedOut`, nothing written) a token older
than the stored one of the same scope. What the fence adds to the recorder's lease
check: a check and the write after it are not one step, and on one host the DuckDB file
lock already keeps a second writer out; a store reached by two recorders any other way
(a shared file system, a file copied back) refuses the older one.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import msgspec

from eventstore.codec import decode
from eventstore.events import Event

GENESIS = bytes(32)


class Recorded(NamedTuple):
    """An event to append: the decoded event, its canonical bytes, its bus sequence."""

    event: Event
    payload: bytes
    stream_seq: int | None = None


class Row(NamedTuple):
    """One stored event, as every back end keeps it."""

    position: int
    event: Event
    payload: bytes
    chain_hash: bytes
    stream_seq: int | None


class RawRow(NamedTuple):
    """What replay and audit read back: enough to decode and to re-hash."""

    position: int
    campaign_id: str
    payload: bytes
    chain_hash: bytes
    stream_seq: int | None = None


class Fence(NamedTuple):
    """The recording lease a write is made under (bus/lease.py): its fencing token, and
    the lease bucket it comes from (`scope`; tokens of different buckets don't compare)."""

    token: int
    scope: str


class FencedOut(RuntimeError):
    """A newer holder of the recording lease has written this store: the writer was
    deposed and must stop."""


class AppendResult(NamedTuple):
    appended: int
    duplicates: int
    last_position: int


class ChainReport(msgspec.Struct, frozen=True):
    ok: bool
    events_checked: int
    campaigns: int
    broken_at_position: int | None = None
    broken_campaign: str | None = None
    detail: str = ""


def check_fence(stored: Fence | None, writer: Fence, where: str) -> None:
    """Raise FencedOut if `stored` is a newer token of the writer's lease."""
    if stored is not None and stored.scope == writer.scope and stored.token > writer.token:
        raise FencedOut(
            f"{where} was written under recording lease token {stored.token}; this "
            f"recorder holds the older token {writer.token}: another recorder took over, "
            "so this one stops"
        )


def chain_hash(payload: bytes, previous: bytes, stream_seq: int | None = None) -> bytes:
    """A link under chain rule 2: the payload, the bus sequence it arrived with (the one
    stored column the payload does not hold) and the previous hash. Rule 1 (stores written
    before) hashed `payload || previous` only; a link with no sequence reads alike."""
    sequence = b"" if stream_seq is None else b"\n%d" % stream_seq
    return hashlib.sha256(payload + sequence + previous).digest()


def link_rule(payload: bytes, previous: bytes, stream_seq: int | None, stored: bytes) -> int:
    """The chain rule a stored link follows: 2 (covers `stream_seq`), 1 (written before
    rule 2: its sequence is not covered), or 0 (it follows neither: a break)."""
    if chain_hash(payload, previous, stream_seq) == stored:
        return CHAIN_RULE
    if stream_seq is not None and chain_hash(payload, previous) == stored:
        return 1
    return 0


#: The chain rule new links are written under.
CHAIN_RULE = 2


class EventStore(abc.ABC):
    """An append-only, hash-chained event log with one writer."""

    def __init__(self) -> None:
        self._last_position = 0
        self._heads: dict[str, bytes] = {}
        self._stream_cursor = 0
        self._fence: Fence | None = None

    @property
    def last_position(self) -> int:
        return self._last_position

    @property
    def stream_cursor(self) -> int:
        """The last bus sequence recorded, committed together with the events it brought."""
        return self._stream_cursor

    @property
    def fence(self) -> Fence | None:
        """The recording lease the last fenced write was made under."""
        return self._fence

    def append(
        self,
        batch: Sequence[Recorded],
        stream_cursor: int | None = None,
        fence: Fence | None = None,
    ) -> AppendResult:
        """Append new events in one atomic write; events already stored are skipped.

        `stream_cursor`, if given, is committed in the same transaction, so a recorder
        that crashes resumes exactly after the last batch it committed. With `fence`, the
        same transaction refuses (FencedOut, nothing written) if the store was written
        under a newer token of the same lease, and keeps this one beside the cursor.
        """
        unique: dict[str, Recorded] = {}
        for item in batch:
            unique.setdefault(item.event.event_id, item)
        fresh = list(unique.values())
        rows, heads = self._sequence(fresh)
        if not self._write(rows, stream_cursor, fence):  # a stored id collided: redo without
            known = self._stored_ids([item.event.event_id for item in fresh])
            fresh = [item for item in fresh if item.event.event_id not in known]
            rows, heads = self._sequence(fresh)
            if not self._write(rows, stream_cursor, fence):
                raise RuntimeError("event id collision persisted after removing duplicates")
        if rows:
            self._last_position = rows[-1].position
            self._heads.update(heads)
        if stream_cursor is not None:
            self._stream_cursor = stream_cursor
        if fence is not None:
            self._fence = fence
        return AppendResult(len(rows), len(batch) - len(rows), self._last_position)

    def _sequence(self, items: list[Recorded]) -> tuple[list[Row], dict[str, bytes]]:
        heads: dict[str, bytes] = {}
        rows: list[Row] = []
        position = self._last_position
        for event, payload, stream_seq in items:
            position += 1
            campaign = event.campaign_id
            previous = heads.get(campaign) or self._heads.get(campaign, GENESIS)
            digest = chain_hash(payload, previous, stream_seq)
            heads[campaign] = digest
            rows.append(Row(position, event, payload, digest, stream_seq))
        return rows, heads

    def replay(
        self, campaign_id: str | None = None, after_position: int = 0
    ) -> Iterator[tuple[int, Event]]:
        """(position, event) in position order, decoded and upcast to the current schema."""
        for position, payload in self.read_payloads(campaign_id, after_position):
            yield position, decode(payload)

    def replay_types(self, types: Sequence[str]) -> Iterator[tuple[int, Event]]:
        """(position, event) of the given types, in position order (back ends filter in
        their own query where they can)."""
        wanted = set(types)
        for position, event in self.replay():
            if event.type in wanted:
                yield position, event

    def verify_chain(self, campaign_id: str | None = None) -> ChainReport:
        """Re-hash every event; report the first position whose stored hash disagrees."""
        heads: dict[str, bytes] = {}
        covered: set[str] = set()  # campaigns with a rule-2 link: no rule-1 link after it
        checked = 0
        for raw in self.read_raw(campaign_id, 0):
            previous = heads.get(raw.campaign_id, GENESIS)
            rule = link_rule(raw.payload, previous, raw.stream_seq, raw.chain_hash)
            if rule == CHAIN_RULE and raw.stream_seq is not None:
                covered.add(raw.campaign_id)
            if rule == 0 or (rule == 1 and raw.campaign_id in covered):
                return ChainReport(
                    ok=False,
                    events_checked=checked,
                    campaigns=len(heads),
                    broken_at_position=raw.position,
                    broken_campaign=raw.campaign_id,
                    detail=(
                        f"event at position {raw.position} of campaign {raw.campaign_id!r} "
                        "does not match its chain hash: it was altered or the chain was cut"
                    ),
                )
            heads[raw.campaign_id] = raw.chain_hash
            checked += 1
        return ChainReport(ok=True, events_checked=checked, campaigns=len(heads))

    def holds(self, event_id: str) -> bool:
        """Whether the event `event_id` is stored."""
        return bool(self._stored_ids([event_id]))

    def campaign_heads(self) -> dict[str, bytes]:
        return dict(self._heads)

    # --- what a back end provides ---------------------------------------------------------

    @abc.abstractmethod
    def _write(self, rows: list[Row], stream_cursor: int | None, fence: Fence | None) -> bool:
        """Persist rows, cursor and fence atomically; False (nothing written) if an event id
        exists; FencedOut (nothing written) if `fence` is older than the stored one."""

    @abc.abstractmethod
    def _stored_ids(self, event_ids: Iterable[str]) -> set[str]:
        """The subset of `event_ids` already stored."""

    @abc.abstractmethod
    def read_raw(self, campaign_id: str | None = None, after_position: int = 0) -> Iterator[RawRow]:
        """Stored rows in position order, optionally one campaign's, after a position."""

    @abc.abstractmethod
    def read_payloads(
        self, campaign_id: str | None = None, after_position: int = 0
    ) -> Iterator[tuple[int, bytes]]:
        """(position, canonical bytes) in position order: the lean path replay uses."""

    @abc.abstractmethod
    def close(self) -> None: ...
