"""What an audit says about one claim: it agrees, it differs (with the evidence), or it
was skipped on this host (with the reason).

`kfactory audit` (`ops/audit_cmd.py`) makes three kinds, by `area`: the record (`chain`,
`columns`: `eventstore/chain_audit.py`), the projections (`projection`, `kernel`:
`actors/records/audit.py`) and, with `--reverify K`, the best kernels run again here
(`reverify`: `actors/records/reverify.py`). It prints one `line` per claim.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Status = Literal["agrees", "differs", "skipped"]


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
