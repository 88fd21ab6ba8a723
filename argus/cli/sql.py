"""``argus sql``: analysts' SQL over the store."""

from __future__ import annotations

import csv
import json
import sys
from enum import StrEnum
from typing import Any

import typer
from rich.table import Table

from ._app import app, console
from ._store import command_store


class Format(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


@app.command()
def sql(
    query: str = typer.Argument(..., help='ClickHouse SQL, e.g. "SELECT count() FROM steps"'),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="table, csv or json"),
    param: list[str] = typer.Option([], "--param", "-p", help="bound parameter NAME=VALUE for {NAME:Type}"),
) -> None:
    """Run SQL over the store and print the result (bound parameters with --param)."""
    params = {}
    for p in param:
        name, sep, value = p.partition("=")
        if not sep or not name:
            from ._app import fail

            fail(f"--param wants NAME=VALUE, got {p!r}")
        params[name] = value
    with command_store() as store:
        result = store.query_arrow(query, params or None)
    names = result.column_names
    rows = list(zip(*(c.to_pylist() for c in result.columns), strict=True)) if names else []
    if fmt is Format.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(names)
        writer.writerows([[_jsonable(v) for v in r] for r in rows])
    elif fmt is Format.json:
        sys.stdout.write(
            json.dumps([{n: _jsonable(v) for n, v in zip(names, r, strict=True)} for r in rows]) + "\n"
        )
    else:
        table = Table(*names, caption=f"{len(rows)} row(s)")
        for r in rows:
            table.add_row(*(str(_jsonable(v)) for v in r))
        console.print(table)
