"""Opening the run folder's store for the commands that read history (replay, audit,
best, campaigns, report, export), with one-line errors.

They open the file read-only (`eventstore/snapshot.py`). DuckDB lets no reader beside its
writer: while a server holds the file, `open_history` (campaigns, replay, report, best)
reads through the server instead (`ops/server_store.py`), and `open_home` (audit and
export, which read the file itself) says so, with its pid, and reads nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Protocol

from actors.campaign.history import HISTORY_TYPES
from actors.records.story import Rebuilt, UnknownCampaign, rebuild
from eventstore.duckdb_store import StoreLocked
from eventstore.events import Event
from eventstore.snapshot import Snapshot, open_snapshot
from ops.errors import UserError
from ops.home import client_auth_for, resolve_home, running_server, store_path
from ops.server_store import ServerSnapshot


def open_home(home: Path | None) -> Snapshot:
    """The store of --home, read-only. DuckDB lets no reader beside its writer, so a
    running server must be stopped first (its events are all on disk)."""
    folder = resolve_home(home)
    path = store_path(folder)
    if not path.exists():
        raise UserError(f"no event store at {path}; run a campaign first or pass --home")
    try:
        return open_snapshot(path)
    except StoreLocked as exc:
        owner = running_server(folder)
        who = f" (pid {owner.pid})" if owner else ""
        raise UserError(
            f"{path} is held by a running server{who}; stop it, or read a copy of the file "
            "with --home pointing at the copy's folder"
        ) from exc
    except OSError as exc:
        raise UserError(str(exc)) from exc


class HistoryStore(Protocol):
    """What the history commands read: the store file, or the server that holds it."""

    path: Path

    def __enter__(self) -> HistoryStore: ...

    def __exit__(self, *_: object) -> None: ...

    def events(
        self, campaign_id: str | None = None, types: list[str] | None = None
    ) -> Iterator[tuple[int, Event]]: ...

    def campaign_ids(self) -> list[str]: ...

    def last_times(self) -> dict[str, datetime]: ...


def open_history(home: Path | None) -> HistoryStore:
    """The store of --home: the file read-only, or through the running server that holds
    it (as `kfactory sql` does)."""
    folder = resolve_home(home)
    server = running_server(folder)
    if server is not None:
        return ServerSnapshot(store_path(folder), server.url, client_auth_for(folder, "cli"))
    return open_home(folder)


def rebuild_campaign(
    snapshot: HistoryStore,
    campaign_id: str,
    at_position: int | None = None,
    at_time: datetime | None = None,
    *,
    scope: bool = False,
) -> Rebuilt:
    """The campaign rebuilt from its events (with `scope`, every campaign's history too)."""
    events = snapshot.events(types=HISTORY_TYPES) if scope else snapshot.events(campaign_id)
    try:
        return rebuild(events, campaign_id, at_position, at_time)
    except UnknownCampaign as exc:
        known = ", ".join(snapshot.campaign_ids()[:10]) or "none"
        raise UserError(f"{exc.args[0]} (campaigns: {known})") from None
