"""The run folder's store read through its running server, for the commands that read
history (`campaigns`, `replay`, `report`, ...) while a server holds the file.

DuckDB lets no reader beside its writer, so while `kfactory run` or `kfactory server`
records, these commands ask the server's query service instead, as `kfactory sql` does:
the events by replay pages over the bus (`eventstore.queries.replay`), and SQL for the
rest. `ServerSnapshot` offers what `eventstore.snapshot.Snapshot` offers them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from bus.auth import ClientAuth
from bus.connection import INTERACTIVE_WAIT, Client, connect
from eventstore.events import Event
from eventstore.queries import query, replay

T = TypeVar("T")


class ServerSnapshot:
    """The store at `path`, as the server at `url` answers for it."""

    def __init__(self, path: Path, url: str, auth: ClientAuth) -> None:
        self.path = path
        self.url = url
        self.auth = auth

    def __enter__(self) -> ServerSnapshot:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing held between questions: each opens its own connection."""

    def _ask(self, asking: Callable[[Client], Awaitable[T]]) -> T:
        async def ask() -> T:
            nc = await connect(
                self.url, "kfactory-history", wait_for_server=INTERACTIVE_WAIT, auth=self.auth
            )
            try:
                return await asking(nc)
            finally:
                await nc.close()

        return asyncio.run(ask())

    def events(
        self, campaign_id: str | None = None, types: list[str] | None = None
    ) -> Iterator[tuple[int, Event]]:
        """(position, event) in position order, as `Snapshot.events`."""
        return iter(self._ask(lambda nc: replay(nc, campaign_id=campaign_id, types=types)))

    def campaign_ids(self) -> list[str]:
        return [event.campaign_id for _, event in self.events(types=["CampaignStarted"])]

    def last_times(self) -> dict[str, datetime]:
        """Per campaign, the time of its last stored event."""
        found = self._ask(
            lambda nc: query(nc, "SELECT campaign_id, max(ts) FROM events GROUP BY campaign_id")
        )
        return {str(c): datetime.fromisoformat(str(ts)) for c, ts in found.rows}
