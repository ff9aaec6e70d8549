"""The read-only rule for user SQL: exactly one SELECT (or WITH ... SELECT) statement."""

from __future__ import annotations

import duckdb


class SqlRefused(ValueError):
    """SQL that is not a single read-only query."""


def check_read_only(sql: str) -> str:
    """Return the single SELECT statement in `sql`, or raise SqlRefused saying why."""
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
    return sql
