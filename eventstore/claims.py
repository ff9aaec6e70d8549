"""What an audit says about one claim: it agrees, it differs (with the evidence), it
was skipped (nothing to check), or it is not re-verifiable here (a re-measurement this
host cannot make or judge: another device; `kfactory audit` fails on those unless told
`--allow-unverifiable`).

`kfactory audit` (`ops/audit_cmd.py`) makes three kinds, by `area`: the record (`chain`,
`columns`: `eventstore/chain_audit.py`), the projections (`projection`, `kernel`:
`actors/records/audit.py`) and, with `--reverify K`, the best kernels run again here
(`reverify`: `actors/records/reverify.py`). It prints one `line` per claim.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Status = Literal["agrees", "differs", "skipped", "unverifiable"]


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    area: str  # chain | columns | projection | kernel | reverify
    name: str
    status: Status
    evidence: str
    position: int | None = None

    def line(self) -> str:
        where = f" [position {self.position}]" if self.position is not None else ""
        return f"{self.status:<7} {self.area}: {self.name}{where}: {self.evidence}"


def agrees(area: str, name: str, evidence: str, position: int | None = None) -> Claim:
    return Claim(area=area, name=name, status="agrees", evidence=evidence, position=position)


def differs(area: str, name: str, evidence: str, position: int | None = None) -> Claim:
    return Claim(area=area, name=name, status="differs", evidence=evidence, position=position)


def skipped(area: str, name: str, evidence: str, position: int | None = None) -> Claim:
    return Claim(area=area, name=name, status="skipped", evidence=evidence, position=position)


def unverifiable(area: str, name: str, evidence: str, position: int | None = None) -> Claim:
    """A claim this host cannot re-run or judge: not passed, not failed, listed."""
    return Claim(area=area, name=name, status="unverifiable", evidence=evidence, position=position)
