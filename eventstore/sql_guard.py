"""The read-only rule for user SQL, judged on DuckDB's own parse tree.

A query passes only if it is one statement that DuckDB can serialise as a SELECT
(`json_serialize_sql` refuses every other kind) and no node anywhere in its tree, CTEs and
subqueries included, is anything but a query node that reads (`WITH d AS (DELETE ...
RETURNING *) SELECT ...` has a DELETE node inside and is refused).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import duckdb

#: The query nodes that only read.
READING_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})

_parser = duckdb.connect(":memory:")
_parser_lock = threading.Lock()


class SqlRefused(ValueError):
    """SQL that is not a single read-only query."""


def _query_nodes(tree: Any) -> Iterator[str]:
    """The type of every query node in a serialised parse tree."""
    if isinstance(tree, dict):
        kind = tree.get("type")
        if isinstance(kind, str) and kind.endswith("_NODE"):
            yield kind
        for value in tree.values():
            yield from _query_nodes(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from _query_nodes(item)


def check_read_only(sql: str) -> str:
    """Return `sql` if it is a single read-only query, else raise SqlRefused saying why."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise SqlRefused(f"SQL does not parse: {exc}") from exc
    if len(statements) != 1:
        raise SqlRefused(
            f"{len(statements)} statements given; only a single SELECT or WITH query is allowed"
        )
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        name = getattr(kind, "name", str(kind))
        raise SqlRefused(
            f"{name} statements are refused: the event store is read-only to queries "
            "(a single SELECT or WITH query only)"
        )
    with _parser_lock:
        row = _parser.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
    tree: dict[str, Any] = json.loads(row[0]) if row else {"error": True}
    if tree.get("error"):
        raise SqlRefused(f"not a read-only query: {tree.get('error_message', 'unparsable')}")
    if len(tree.get("statements", [])) != 1:
        raise SqlRefused("only a single SELECT or WITH query is allowed")
    writing = sorted(set(_query_nodes(tree)) - READING_NODES)
    if writing:
        names = ", ".join(
            node.removesuffix("_QUERY_NODE").removesuffix("_NODE") for node in writing
        )
        raise SqlRefused(
            f"the query contains {names}: the event store is read-only to queries, "
            "inside CTEs and subqueries too"
        )
    return sql
