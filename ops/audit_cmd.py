"""`kfactory audit CAMPAIGN`: check the record, re-derive the claims, re-run the winners."""

from __future__ import annotations

from pathlib import Path

import typer

from actors.campaign.history import HISTORY_TYPES
from actors.records.audit import audit_projections
from actors.records.reverify import reverify
from eventstore.causality import INDEXED_TYPES, causality_claim
from eventstore.chain_audit import (
    check_anchor,
    check_chain,
    check_columns,
    check_positions,
    missing_positions,
)
from eventstore.claims import Claim
from eventstore.snapshot import Snapshot
from ops.errors import UserError
from ops.options import HOME, JSON
from ops.output import to_json
from ops.store_access import open_home, rebuild_campaign

AUDIT_HELP = """Audit a campaign: is its record intact, and do its claims hold?

1. The record: every stored payload is re-hashed into the campaign's chain (the exact stored bytes), positions must be gap-free, and the queryable columns must say what the payloads say. A break is named by position: an edited payload, an event inserted or removed, two events swapped.

2. The projections: the history is replayed and, at the moment each claim was made, what it should have said is rebuilt: each generation's lessons and its best kernel, the dedupe answers, the summary and finish reason. Every kernel source must hash to the identity later events name. Every benchmark must follow a verification of its source by a verifier and a calibration of its device and, for a head-to-head, the incumbent's own recorded result (the recorder's causality rule).

3. With --reverify K: the K best kernels are verified again on fresh inputs (a new seed, every distribution) and timed again against the baseline on this host. A speedup lower than recorded beyond both measurements' spread "differs". Without the target's device (cuda on a CPU host) the kernels are compiled and statically checked, and the rest is reported as skipped.

Anchoring: --export-head prints every campaign's head hash; keep it elsewhere, and a later audit with --expect-head HASH tells whether the tail after it was cut off.

One line per claim: agrees, differs (with the evidence) or skipped (with why). Exit status 1 when anything differs, 0 otherwise.

Examples:

  kfactory audit demo-softmax

  kfactory audit demo-softmax --reverify 3 --json

  kfactory audit --export-head > heads.txt

  kfactory audit demo-softmax --expect-head 3f5a...c2
"""  # noqa: E501


def audit(
    campaign: str | None = typer.Argument(None, help="The campaign id (its name)."),
    reverify_top: int = typer.Option(
        0, "--reverify", min=0, metavar="K", help="Re-verify and re-time the K best kernels."
    ),
    seed: int | None = typer.Option(
        None, "--seed", help="Seed of the fresh inputs (default: a new random one)."
    ),
    expect_head: str | None = typer.Option(
        None, "--expect-head", metavar="HASH", help="A head hash exported before."
    ),
    allow_unverifiable: bool = typer.Option(
        False,
        "--allow-unverifiable",
        help="Exit 0 even when some claims cannot be re-verified on this host.",
    ),
    export_head: bool = typer.Option(
        False, "--export-head", help="Print each campaign's position and head hash, and stop."
    ),
    home: Path | None = HOME,
    as_json: bool = JSON,
) -> None:
    with open_home(home) as snapshot:
        if export_head:
            _export_heads(snapshot, campaign, as_json)
            return
        if campaign is None:
            raise UserError("give a CAMPAIGN to audit, or --export-head (see --help)")
        claims = audit_claims(snapshot, campaign, expect_head)
        if reverify_top:
            rebuilt = rebuild_campaign(snapshot, campaign)
            claims += reverify(rebuilt.history, campaign, reverify_top, seed)
    failed = [c for c in claims if c.status == "differs"]
    unchecked = [c for c in claims if c.status == "unverifiable"]
    ok = not failed and (allow_unverifiable or not unchecked)
    if as_json:
        print(
            to_json(
                {
                    "campaign_id": campaign,
                    "ok": ok,
                    "not_reverifiable_here": [c.name for c in unchecked],
                    "claims": claims,
                }
            )
        )
    else:
        for claim in claims:
            print(claim.line())
        verdict = f"{len(failed)} claim(s) differ" if failed else "all checked claims agree"
        if unchecked:
            names = ", ".join(c.name for c in unchecked)
            verdict += f"; {len(unchecked)} not re-verifiable here ({names})"
        elif not failed:
            verdict = "all agree"
        print(f"{campaign}: {verdict}")
    if not ok:
        raise typer.Exit(1)


def audit_claims(snapshot: Snapshot, campaign: str, expect_head: str | None) -> list[Claim]:
    """The record and the projections (everything but re-measurement)."""
    rows = list(snapshot.rows(campaign))
    if not rows:
        known = ", ".join(snapshot.campaign_ids()[:10]) or "none"
        raise UserError(f"no events of campaign {campaign!r} (campaigns: {known})")
    positions = snapshot.positions()
    claims = [check_positions(positions)]
    claims += check_chain(rows, campaign, missing_positions(positions))
    claims.append(check_columns(rows))
    if expect_head is not None:
        claims.append(check_anchor(rows, campaign, expect_head))
    try:
        claims += audit_projections(snapshot.events(types=HISTORY_TYPES), campaign)
        cited = [*INDEXED_TYPES, "FinalRankingTimed"]  # a final run's claims are checked too
        claims.append(causality_claim(snapshot.events(types=cited), campaign))
    except Exception as exc:  # a record too damaged to replay is itself a finding
        claims.append(
            Claim(
                area="projection",
                name="replay",
                status="differs",
                evidence=f"the events cannot be replayed: {type(exc).__name__}: {exc}",
            )
        )
    return claims


def _export_heads(snapshot: Snapshot, campaign: str | None, as_json: bool) -> None:
    heads = snapshot.heads()
    if campaign is not None:
        if campaign not in heads:
            raise UserError(f"no events of campaign {campaign!r}")
        heads = {campaign: heads[campaign]}
    if as_json:
        print(
            to_json(
                [{"campaign_id": c, "position": p, "head": h.hex()} for c, (p, h) in heads.items()]
            )
        )
        return
    for name, (position, head) in heads.items():
        print(f"{name}\t{position}\t{head.hex()}")


def register(app: typer.Typer) -> None:
    app.command("audit", help=AUDIT_HELP)(audit)
