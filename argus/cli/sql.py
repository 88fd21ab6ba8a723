"""``argus sql``: analysts' SQL over the store, behaving like clickhouse-client.

- On a terminal the result is a table; piped or redirected it is TSV with a header
  (``TabSeparatedWithNames``, written by ClickHouse itself), one row per line, never wrapped.
- A query ending in ``FORMAT <name>`` is ClickHouse's to format: its bytes are written as
  they come (``SELECT 1 AS a FORMAT JSONEachRow`` prints ``{"a":1}``).
- ``-`` reads the query from stdin (``argus sql - < query.sql``).
- ``-f json`` / ``-f jsonl`` write Decimal as JSON numbers, dates as ISO strings, UInt64 exactly.
"""

from __future__ import annotations

import csv
import math
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, BinaryIO

import typer

from ._app import app, console, fail
from ._store import command_store

if TYPE_CHECKING:  # imported when a command runs: `argus --version` needs no pyarrow
    import pyarrow as pa

    from argus.sinks import Store

__all__ = ["Format", "format_clause", "tsv_escape"]

_FORMAT_CLAUSE = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9]*)\s*;?\s*\Z", re.IGNORECASE)


class Format(StrEnum):
    """Output formats when the query has no FORMAT clause of its own."""

    auto = "auto"
    table = "table"
    tsv = "tsv"
    csv = "csv"
    json = "json"
    jsonl = "jsonl"


def format_clause(query: str) -> str | None:
    """The ClickHouse output format a query names at its end (``FORMAT JSONEachRow``), or None."""
    m = _FORMAT_CLAUSE.search(query.strip())
    return m.group(1) if m else None


_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"})


def tsv_escape(value: Any) -> str:
    """A value as ClickHouse's TabSeparated writes it (backslash escapes, \\N for NULL)."""
    if value is None:
        return "\\N"
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    elif isinstance(value, bool):
        value = int(value)
    elif hasattr(value, "isoformat"):
        value = (
            value.isoformat(sep=" ")
            if hasattr(value, "hour") and hasattr(value, "day")
            else value.isoformat()
        )
    elif isinstance(value, (list, tuple)):
        value = "[" + ",".join(_literal(v) for v in value) + "]"
    elif isinstance(value, dict):
        value = "{" + ",".join(f"{_literal(k)}:{_literal(v)}" for k, v in value.items()) + "}"
    return str(value).translate(_TSV_ESCAPES)


def _shown(value: Any) -> Any:
    """A value for the terminal table: a float to 6 decimals (34.876359, not the binary noise
    of 34.876358675000006); TSV, CSV and JSON keep every digit."""
    return round(value, 6) if isinstance(value, float) and math.isfinite(value) else value


def _literal(value: Any) -> str:
    """A value inside an Array/Map as ClickHouse's TabSeparated writes it (strings and dates quoted)."""
    if value is None:
        return "NULL"
    if isinstance(value, str) or hasattr(value, "isoformat"):
        text = value if isinstance(value, str) else tsv_escape(value)
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return tsv_escape(value)


def _json_hook(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    raise NotImplementedError(f"cannot write {type(value).__name__} as JSON")


def _json_rows(names: list[str], rows: Iterable[tuple[Any, ...]]) -> Iterator[bytes]:
    import msgspec

    encoder = msgspec.json.Encoder(decimal_format="number", enc_hook=_json_hook)
    for row in rows:
        yield encoder.encode(dict(zip(names, row, strict=True)))


def _raw(store: Store, query: str, params: Mapping[str, Any] | None, out: BinaryIO) -> None:
    """Run a query with its own FORMAT clause and copy ClickHouse's bytes to ``out`` as they come."""
    for chunk in store.query_raw(query, params):
        out.write(chunk)
        out.flush()


def _time_text_type(t: pa.DataType) -> pa.DataType | None:
    """The type a column with timestamps becomes as text (lists of them too), or None."""
    import pyarrow as pa

    if pa.types.is_timestamp(t):
        return pa.string()
    if pa.types.is_list(t):
        inner = _time_text_type(t.value_type)
        return None if inner is None else pa.list_(inner)
    return None


def _time_text(array: pa.Array) -> pa.Array:
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_timestamp(array.type):
        return pc.strftime(array, format="%Y-%m-%d %H:%M:%S")
    # a list: its values as text under the same offsets and nulls
    return pa.ListArray.from_arrays(array.offsets, _time_text(array.values), mask=array.is_null())


def _times_as_text(table: pa.Table) -> pa.Table:
    """Timestamp columns (and lists of them) as clickhouse-client prints them:
    ``2026-01-02 03:04:05[.123]`` in the column's time zone, no offset (``%S`` carries the
    column's fraction digits)."""
    import pyarrow as pa

    for i, field in enumerate(table.schema):
        target = _time_text_type(field.type)
        if target is not None:
            chunks = [_time_text(c) for c in table.column(i).chunks]
            table = table.set_column(
                i, pa.field(field.name, target, field.nullable), pa.chunked_array(chunks, target)
            )
    return table


@app.command()
def sql(
    query: str = typer.Argument(..., help='ClickHouse SQL, e.g. "SELECT count() FROM steps"; - reads stdin'),
    fmt: Format = typer.Option(
        Format.auto,
        "--format",
        "-f",
        help="auto (table on a terminal, TSV with a header when piped), table, tsv, csv, json or jsonl; "
        "a FORMAT clause in the query overrides it",
    ),
    param: list[str] = typer.Option([], "--param", "-p", help="bound parameter NAME=VALUE for {NAME:Type}"),
) -> None:
    """Run SQL over the store and print the result (bound parameters with --param)."""
    if query == "-":
        query = sys.stdin.read()
    if not query.strip():
        fail("empty query")
    params = {}
    for p in param:
        name, sep, value = p.partition("=")
        if not sep or not name:
            fail(f"--param wants NAME=VALUE, got {p!r}")
        params[name] = value
    out = sys.stdout.buffer
    if fmt is Format.auto:
        fmt = Format.table if sys.stdout.isatty() else Format.tsv
    with command_store() as store:
        if format_clause(query) or fmt is Format.tsv:  # ClickHouse's own bytes (TSV: TabSeparatedWithNames)
            _raw(store, query, params or None, out)
            return
        result = _times_as_text(store.query_arrow(query, params or None))
    names = result.column_names
    rows = list(zip(*(c.to_pylist() for c in result.columns), strict=True)) if names else []
    if fmt is Format.csv:
        import io

        text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
        writer = csv.writer(text)
        writer.writerow(names)
        writer.writerows(
            [[tsv_escape(v) if v is None or not isinstance(v, str) else v for v in r] for r in rows]
        )
        text.detach()
    elif fmt is Format.jsonl:
        for line in _json_rows(names, rows):
            out.write(line + b"\n")
    elif fmt is Format.json:
        out.write(b"[" + b",".join(_json_rows(names, rows)) + b"]\n")
    else:
        from rich.table import Table

        table = Table(*names, caption=f"{len(rows)} row(s)")
        for r in rows:
            table.add_row(*(tsv_escape(_shown(v)) for v in r))
        console.print(table)
    out.flush()
