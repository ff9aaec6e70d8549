"""How long a stall takes to be said: a kernel writer that always fails (the default 5
deliveries) on an embedded hub. Prints each lifecycle event's time after CampaignStarted.

Run: `python -m tests.measure_stalls`.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from eventstore.queries import replay
from ops.hub import running_hub
from tests.test_stalls import BrokenWriter, crew, run_campaign, small_campaign


class DefaultBrokenWriter(BrokenWriter):
    max_deliver = 5
    give_up_after = 0.0


async def main() -> None:
    async with running_hub(Path(tempfile.mkdtemp())) as hub:
        async with crew(hub, {"kernel-writer": DefaultBrokenWriter()}):
            began = time.monotonic()
            result = await run_campaign(hub, small_campaign("dead", 6, 3), timeout=120)
            took = time.monotonic() - began
        events = [e for _, e in await replay(hub.nc, campaign_id="dead")]
    start = next(e.ts for e in events if e.type == "CampaignStarted")
    for e in events:
        if e.type in ("GenerationOpened", "DeadLettered", "GenerationClosed", "CampaignStalled"):
            print(f"{(e.ts - start).total_seconds():7.2f} s  {e.type}")
    print(f"follow_campaign returned the stall after {took:.2f} s: {result['stalled']}")


if __name__ == "__main__":
    asyncio.run(main())
