"""A small actor for runtime tests: answers CampaignStarted with CampaignFinished.

Run as a process: `python -m tests.echo_actor NATS_URL SLOW_SECONDS GRACE_SECONDS`.
"""

from __future__ import annotations

import asyncio
import sys

from actors.runtime import Actor, Reactions, run_actor
from eventstore.events import CampaignFinished, CampaignStarted, Event


class EchoActor(Actor):
    role = "planner"  # a role allowed to emit CampaignFinished
    reacts_to = (CampaignStarted,)

    def __init__(self, slow: float = 0.0, grace: float = 10.0, fail_first: int = 0) -> None:
        self.slow = slow
        self.shutdown_grace = grace
        self.fail_first = fail_first
        self.max_deliver = 3
        self.give_up_after = 0.0
        self.calls = 0

    async def handle(self, event: Event, out: Reactions) -> None:
        assert isinstance(event, CampaignStarted)
        self.calls += 1
        await asyncio.sleep(self.slow)
        out.emit(CampaignFinished, reason=f"echo of {event.name}")
        if event.name == "always-fails" or self.calls <= self.fail_first:
            raise RuntimeError(f"failure on call {self.calls}")


if __name__ == "__main__":
    from ops.logging import configure_logging

    configure_logging()
    url, slow, grace = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    asyncio.run(run_actor(EchoActor(slow, grace), url))
