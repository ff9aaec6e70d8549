"""Printing query results and records as a table, CSV or JSON."""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

_json = msgspec.json.Encoder(enc_hook=str)


def to_json(value: Any) -> str:
    return _json.encode(value).decode()


def console() -> Console:
    """Rich output; wide when it goes to a file or a pipe (no terminal to fit)."""
    return Console(width=None if sys.stdout.isatty() else 160)


def print_rows(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str, title: str | None = None
) -> None:
    if fmt == "json":
        print(to_json([dict(zip(columns, row, strict=True)) for row in rows]))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        table = Table(title=title, show_lines=False)
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row))
        console().print(table)
