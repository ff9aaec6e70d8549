"""Read-only SQL over the bus: judged on the parse tree, timed, concurrent, paged."""

from __future__ import annotations

import asyncio
import time

import pytest

from bus.connection import connect
from eventstore.duckdb_store import QueryTimeout
from eventstore.emitter import Emitter
from eventstore.queries import PAGE_BYTES, QueryFailed, query
from eventstore.sql_guard import SqlRefused, check_read_only
from ops.hub import Hub
from tests.conftest import started

DELETING_CTE = "WITH d AS (DELETE FROM events RETURNING *) SELECT count(*) FROM d"
SLOW = "SELECT count(*) FROM range(100000) a, range(100000) b WHERE (a.range * b.range) % 7 = 3"


@pytest.mark.parametrize(
    "sql",
    [
        DELETING_CTE,
        "SELECT * FROM (WITH d AS (INSERT INTO events SELECT * FROM events RETURNING *) "
        "SELECT * FROM d)",
        "WITH u AS (UPDATE events SET type = 'x' RETURNING *) SELECT 1",
        "DELETE FROM events",
        "SELECT 1; SELECT 2",
        "PRAGMA version",
    ],
)
def test_anything_that_writes_is_refused_on_its_parse_tree(sql: str) -> None:
    with pytest.raises(SqlRefused):
        check_read_only(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "WITH x AS (SELECT 1 AS a) SELECT a FROM x",
        "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 3) "
        "SELECT * FROM t",
        "SELECT 'DELETE_QUERY_NODE' AS delete_me",
        "SELECT 1 UNION SELECT 2",
    ],
)
def test_reading_queries_pass(sql: str) -> None:
    assert check_read_only(sql) == sql


@pytest.mark.asyncio
async def test_the_deleting_cte_is_refused_over_the_bus_and_nothing_runs(hub: Hub) -> None:
    await Emitter(hub.nc.jetstream()).emit(started())
    await hub.wait_for_position(1)
    with pytest.raises(SqlRefused, match="DELETE"):
        await query(hub.nc, DELETING_CTE)
    assert (await query(hub.nc, "SELECT count(*) FROM events")).rows == [[1]]


@pytest.mark.asyncio
async def test_a_slow_query_times_out_while_another_client_is_answered(hub: Hub) -> None:
    other = await connect(hub.url, "other")
    try:
        slow = asyncio.create_task(query(hub.nc, SLOW, timeout=3))
        await asyncio.sleep(0.5)  # the slow query is running
        began = time.monotonic()
        quick = await query(other, "SELECT 1")
        answered_in = time.monotonic() - began
        assert not slow.done()
        with pytest.raises(QueryFailed, match="query timed out after 3 s"):
            await slow
    finally:
        await other.close()
    assert quick.rows == [[1]]
    assert answered_in < 1.0, answered_in


def test_a_slow_query_on_the_file_times_out_too(hub: Hub) -> None:
    with pytest.raises(QueryTimeout, match="timed out after 1 s"):
        hub.store.query(SLOW, timeout=1)


@pytest.mark.asyncio
async def test_a_result_of_megabytes_arrives_whole(hub: Hub) -> None:
    width, count = 1000, 5000  # 5 MB of text
    result = await query(
        hub.nc,
        f"SELECT range AS i, repeat(chr(65 + (range % 26)::INT), {width}) AS s FROM range({count})",
        max_rows=count,
    )
    assert count * width > 4 * PAGE_BYTES
    assert len(result.rows) == count and not result.truncated
    assert all(row == [i, chr(65 + i % 26) * width] for i, row in enumerate(result.rows)), (
        "rows differ"
    )
    capped = await query(hub.nc, "SELECT range FROM range(100)", max_rows=10)
    assert len(capped.rows) == 10 and capped.truncated
