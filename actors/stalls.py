"""Saying that a campaign cannot go on: a `CampaignStalled` reaction.

`CampaignStalled` has a field named `cause` (why it stalled), which `Reactions.emit`
and `new_event` take as the event that caused a reaction, so it is built here with the
same envelope `emit` gives.
"""

from __future__ import annotations

from datetime import UTC, datetime

from actors.runtime import Reactions
from eventstore.events import CampaignStalled
from eventstore.ids import derived_event_id


def stall(
    out: Reactions, cause: str, detail: str, role: str = "", event_id: str | None = None
) -> CampaignStalled:
    """Record that the cause's campaign stalled; `cause`: no_design_space, dead_lettered..."""
    trigger = out.cause
    event = CampaignStalled(
        event_id=event_id or derived_event_id(trigger.event_id, out.actor.role, len(out.events)),
        campaign_id=trigger.campaign_id,
        schema=CampaignStalled.SCHEMA,
        actor=out.actor,
        causation_id=trigger.event_id,
        correlation_id=trigger.correlation_id or trigger.event_id,
        ts=datetime.now(UTC),
        cause=cause,
        detail=detail,
        role=role,
    )
    out.events.append(event)
    return event
