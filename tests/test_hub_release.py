"""The hub gives back everything it holds however its block ends (normally, by an error in
the block, or by a failure while it starts): the embedded nats-server stops, the
recording lease is released, the store's file is free for another process, and the run
folder no longer names a running hub. Real nats-server processes, real DuckDB files."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from bus.connection import Client, jetstream
from bus.lease import RECORDER_LEASES, LeaseBucket
from bus.server import EmbeddedNatsServer
from ops.home import server_file, store_path
from ops.hub import RECORDER_KEY, running_hub

TTL = 30
"""Long: a lease left held after the block could not have expired by the next check."""


class BlockFailed(Exception):
    """Raised inside the hub's block."""


def _free_for_another_process(path: Path) -> bool:
    """Whether another process can open the DuckDB file read-write (DuckDB locks it)."""
    opened = subprocess.run(
        [sys.executable, "-c", f"import duckdb; duckdb.connect({str(path)!r}).close()"],
        capture_output=True,
        timeout=60,
    )
    return opened.returncode == 0


async def _lease_holder(nc: Client) -> str | None:
    leases = await LeaseBucket.open(jetstream(nc), RECORDER_LEASES, TTL)
    current = await leases.current(RECORDER_KEY)
    return None if current is None else current.holder


@pytest.mark.asyncio
@pytest.mark.parametrize("block_fails", [False, True], ids=["normal_exit", "error_in_block"])
async def test_the_hub_stops_its_server_and_frees_its_store(
    tmp_path: Path, block_fails: bool
) -> None:
    home = tmp_path / "home"
    server: EmbeddedNatsServer | None = None
    try:
        async with running_hub(home, lease_ttl=TTL) as hub:
            server = hub.server
            assert server is not None and server.running
            assert server_file(home).exists()
            assert not _free_for_another_process(store_path(home))
            if block_fails:
                raise BlockFailed
    except BlockFailed:
        assert block_fails
    assert server is not None and not server.running
    assert not server_file(home).exists()
    assert _free_for_another_process(store_path(home))


@pytest.mark.asyncio
@pytest.mark.parametrize("block_fails", [False, True], ids=["normal_exit", "error_in_block"])
async def test_the_hub_releases_the_recording_lease(
    tmp_path: Path, nats_server: EmbeddedNatsServer, nc: Client, block_fails: bool
) -> None:
    try:
        async with running_hub(tmp_path / "home", nats_url=nats_server.url, lease_ttl=TTL):
            assert await _lease_holder(nc) is not None
            if block_fails:
                raise BlockFailed
    except BlockFailed:
        assert block_fails
    assert await _lease_holder(nc) is None


@pytest.mark.asyncio
async def test_a_hub_whose_store_will_not_open_gives_back_its_lease_and_its_server(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    folder = tmp_path / "a-folder.duckdb"
    folder.mkdir()
    with pytest.raises(duckdb.IOException, match=r"a-folder\.duckdb"):
        async with running_hub(home, store=folder, lease_ttl=TTL):
            pytest.fail("the hub opened a folder as its store")
    # the same run folder again: its kept port is free (else the server would not start)
    # and the lease too (else this hub, another holder, would wait TTL seconds for it)
    async with asyncio.timeout(TTL / 2), running_hub(home, lease_ttl=TTL) as hub:
        assert hub.lease is not None
        assert await _lease_holder(hub.nc) == hub.lease.lease.holder
