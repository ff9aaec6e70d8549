"""A kernel an operator wrote says how it came from its parents: KernelWritten's
`operator`, `parents` and `diff` are fields with defaults, so events recorded before them
still decode (no schema bump), and the new ones keep them through the canonical bytes."""

from __future__ import annotations

import msgspec

from eventstore.codec import decode, encode
from eventstore.events import ActorRef, KernelWritten, new_event

ACTOR = ActorRef(role="kernel-writer", instance="t", host="h")


def _written(**extra: object) -> KernelWritten:
    return new_event(
        KernelWritten,
        campaign_id="c",
        actor=ACTOR,
        problem="p",
        target="cpu",
        candidate_id="c:g1:c0",
        generation=1,
        source_hash="h",
        source="void kernel(void) {}\n",
        flags=["-O3"],
        writer="operator",
        template="evolve",
        **extra,
    )


def test_an_operator_child_keeps_its_operator_parents_and_diff() -> None:
    event = _written(operator="omp_simd", parents=["c:g0:c0"], diff="--- a\n+++ b\n")
    back = decode(encode(event))
    assert isinstance(back, KernelWritten)
    assert (back.operator, back.parents, back.diff) == ("omp_simd", ["c:g0:c0"], "--- a\n+++ b\n")


def test_a_kernel_written_before_the_lineage_fields_still_decodes_with_their_defaults() -> None:
    raw = msgspec.json.decode(encode(_written()))
    for name in ("operator", "parents", "diff"):
        raw.pop(name, None)
    old = decode(msgspec.json.encode(raw))
    assert isinstance(old, KernelWritten)
    assert (old.operator, old.parents, old.diff) == ("", [], "")
    assert old.schema == KernelWritten.SCHEMA
