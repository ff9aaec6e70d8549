"""What a benchmark may claim, given what was recorded before it: the causality rule.

A `BenchmarkCompleted` is accepted only when the store already holds
- a `KernelVerified` of the same campaign, candidate, target and source hash, by a
  verifier (the kernel it timed passed verification first);
- a `HostCalibrated`, by a benchmarker, of the device it names (the time belongs to a
  device whose ceilings were measured; a device name nobody calibrated is a forgery);
- when it claims a head-to-head (`incumbent`, `speedup_vs_incumbent` or `head_to_head`),
  a `BenchmarkCompleted` of that incumbent in the same campaign: its own recorded result.

A `FinalRankingTimed` is accepted only when its device was calibrated and every contender
it cites has its own `BenchmarkCompleted` in the same campaign.

The recorder keeps a `Causality` index (sets of keys, built once from the store's
verifications, calibrations and benchmarks, then kept by every event it accepts), so each
check is a set lookup, never a query. A breaking event is refused with `EventRejected`.
`causality_claim` re-derives the same rule over a stored history for the audit: a store
written before the rule may hold events that break it, and the audit says so.

What the calibration rule leaves to a holder of the benchmarker's credentials: it may
calibrate any device name first, so a forged benchmark on an invented device passes
here. That buys nothing those credentials did not already give (a forged figure on the
real device passes the same way): only re-measurement judges a time, and `kfactory
audit --reverify` counts a claim recorded on another device as "not re-verifiable
here" and fails. A forged later calibration of a real device changes no ranked figure
(each benchmarker computes its roofline fraction from its own measurement, not from a
recorded one); it shows in the report's host table and the LLM writer's ceilings. Two
calibrations of one device that disagree are not flagged: a busy host's honest
recalibration differs too, and no tolerance tells it from a forgery.
"""

from __future__ import annotations

from collections.abc import Iterable

from eventstore.claims import Claim, agrees, differs
from eventstore.codec import InvalidEvent
from eventstore.events import (
    BenchmarkCompleted,
    Event,
    FinalRankingTimed,
    HostCalibrated,
    KernelVerified,
)

#: The event types the index is built from.
INDEXED_TYPES = ("KernelVerified", "HostCalibrated", "BenchmarkCompleted")
#: The types the rule may refuse: an actor handles one only once the recorder stored it
#: (`actors/runtime.py`), since admission alone cannot tell.
CHECKED_TYPES = frozenset({"BenchmarkCompleted", "FinalRankingTimed"})
MAX_LISTED = 10


class CausalityBroken(InvalidEvent):
    """An event whose claim cites nothing recorded before it."""


class Causality:
    """The index the causality rule reads: what was verified, calibrated and timed."""

    def __init__(self) -> None:
        self._verified: set[tuple[str, str, str, str]] = set()
        self._calibrated: set[str] = set()
        self._timed: set[tuple[str, str]] = set()

    @classmethod
    def of(cls, events: Iterable[Event]) -> Causality:
        index = cls()
        for event in events:
            index.note(event)
        return index

    def check(self, event: Event) -> None:
        """Raise CausalityBroken when `event` claims what the index cannot back."""
        if isinstance(event, FinalRankingTimed):
            self._check_final(event)
            return
        if not isinstance(event, BenchmarkCompleted):
            return
        verified = (event.campaign_id, event.candidate_id, event.target, event.source_hash)
        if verified not in self._verified:
            raise CausalityBroken(
                f"BenchmarkCompleted of {event.candidate_id} (source {event.source_hash[:16]}, "
                f"target {event.target}) follows no KernelVerified of that source by a verifier"
            )
        if event.device not in self._calibrated:
            raise CausalityBroken(
                f"BenchmarkCompleted of {event.candidate_id} names device {event.device!r}, "
                "which no benchmarker calibrated (no HostCalibrated of it was recorded)"
            )
        claims_head_to_head = (
            event.incumbent is not None
            or event.speedup_vs_incumbent is not None
            or event.head_to_head is not None
        )
        if claims_head_to_head and (
            event.incumbent is None
            or event.incumbent == event.candidate_id
            or (event.campaign_id, event.incumbent) not in self._timed
        ):
            raise CausalityBroken(
                f"BenchmarkCompleted of {event.candidate_id} claims a head-to-head against "
                f"{event.incumbent!r}, which has no recorded result of its own in "
                f"{event.campaign_id}"
            )

    def _check_final(self, event: FinalRankingTimed) -> None:
        if event.device not in self._calibrated:
            raise CausalityBroken(
                f"FinalRankingTimed names device {event.device!r}, which no benchmarker "
                "calibrated (no HostCalibrated of it was recorded)"
            )
        untimed = [
            c.candidate_id
            for c in event.contenders
            if (event.campaign_id, c.candidate_id) not in self._timed
        ]
        if untimed or not event.contenders:
            raise CausalityBroken(
                f"FinalRankingTimed cites {', '.join(untimed) or 'no contender'}, which has no "
                f"recorded BenchmarkCompleted of its own in {event.campaign_id}"
            )

    def note(self, event: Event) -> None:
        """Keep what an accepted event lets later events cite."""
        if isinstance(event, KernelVerified) and event.actor.role == "verifier":
            self._verified.add(
                (event.campaign_id, event.candidate_id, event.target, event.source_hash)
            )
        elif isinstance(event, HostCalibrated) and event.actor.role == "benchmarker":
            self._calibrated.add(event.device)
        elif isinstance(event, BenchmarkCompleted):
            self._timed.add((event.campaign_id, event.candidate_id))


def causality_claim(events: Iterable[tuple[int, Event]], campaign_id: str) -> Claim:
    """The rule re-derived over a stored history (every campaign's verifications,
    calibrations and benchmarks, in position order), for one campaign's benchmarks."""
    index = Causality()
    broken: list[tuple[int, str]] = []
    checked = 0
    for position, event in events:
        if event.campaign_id == campaign_id and isinstance(
            event, BenchmarkCompleted | FinalRankingTimed
        ):
            checked += 1
            try:
                index.check(event)
            except CausalityBroken as exc:
                broken.append((position, str(exc)))
        index.note(event)
    name = "benchmarks follow their verification"
    if broken:
        shown = "; ".join(f"position {p}: {why}" for p, why in broken[:MAX_LISTED])
        more = f" (and {len(broken) - MAX_LISTED} more)" if len(broken) > MAX_LISTED else ""
        return differs(
            "causality", name, f"{len(broken)} break the rule: {shown}{more}", broken[0][0]
        )
    return agrees(
        "causality",
        name,
        f"{checked} benchmarks and final runs each follow a calibration of their device, and "
        "a verification of their source, the incumbent's own result for a head-to-head, or "
        "each contender's own result for a final run",
    )
