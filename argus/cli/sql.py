"""``argus sql``: analysts' SQL over the store, behaving like clickhouse-client.

- On a terminal the result is a table; piped or redirected it is TSV with a header
  (``TabSeparatedWithNames``, written by ClickHouse itself), one row per line, never wrapped.
- A query ending in ``FORMAT <name>`` is ClickHouse's to format: its bytes are written as
  they come (``SELECT 1 AS a FORMAT JSONEachRow`` prints ``{"a":1}``).
- ``-`` reads the query from stdin (``argus sql - < query.sql``).
- ``-f json`` / ``-f jsonl`` write Decimal as JSON numbers, dates as ISO strings, UInt64 exactly.
- Several statements (``SELECT 1; SELECT 2``) give one result each, in turn, each with its
  own columns (``-f json``: one JSON array per statement, one per line).
- Read-only unless ``--write``: ClickHouse's ``readonly=1`` (no INSERT, ALTER, DROP, SYSTEM,
  ``file()``, ``url()``; no setting lifts it).
- On a terminal no control character of the data reaches it raw (an ESC sequence in a stored
  job name would clear or restyle the analyst's screen): each shows as ``\\xNN``.
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

__all__ = ["Format", "format_clause", "split_queries", "terminal_bytes", "terminal_text", "tsv_escape"]

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


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_BYTES = re.compile(b"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")


def terminal_text(text: str) -> str:
    """``text`` with every control character but tab and newline (ESC, BEL, CR, NUL, C1) shown
    as ``\\xNN``: safe to print on a terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def terminal_bytes(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """UTF-8 output chunks with control bytes (C0 but tab and newline, DEL, C1) shown as
    ``\\xNN``; a C1 character split between two chunks is joined first."""
    carry = b""
    for chunk in chunks:
        data = carry + chunk
        carry = data[-1:] if data.endswith(b"\xc2") else b""
        data = data[: len(data) - len(carry)]
        yield _CONTROL_BYTES.sub(_shown_byte, data)
    if carry:
        yield carry


def _shown_byte(m: re.Match[bytes]) -> bytes:
    return b"\\x%02x" % m.group()[-1]  # a C1 character is \xc2 then its code point


def split_queries(text: str) -> list[str]:
    """The statements of ``text``, split on ``;`` outside quotes (``'`` ``"`` `````), backslash
    escapes and comments (``--``, ``#!``, ``/* */``); blank or comment-only ones dropped."""
    out: list[str] = []
    start, i, n = 0, 0, len(text)
    quote: str | None = None
    while i < n:
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"`":
            quote = c
        elif text.startswith("--", i) or text.startswith("#!", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        elif c == ";":
            out.append(text[start:i])
            start = i + 1
        i += 1
    out.append(text[start:])
    return [q.strip() for q in out if _has_code(q)]


def _has_code(statement: str) -> bool:
    """Whether a statement holds more than blanks and comments."""
    stripped = re.sub(r"/\*.*?\*/", "", statement, flags=re.S)
    stripped = re.sub(r"(--|#!)[^\n]*", "", stripped)
    return bool(stripped.strip())


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
    write: bool = typer.Option(
        False, "--write", help="allow statements that write (INSERT, ALTER, DROP...); read-only without it"
    ),
) -> None:
    """Run SQL over the store and print the result (bound parameters with --param); read-only
    unless --write. Several statements separated by ; give one result each."""
    if query == "-":
        query = sys.stdin.read()
    statements = split_queries(query)
    if not statements:
        fail("empty query")
    params = {}
    for p in param:
        name, sep, value = p.partition("=")
        if not sep or not name:
            fail(f"--param wants NAME=VALUE, got {p!r}")
        params[name] = value
    out = sys.stdout.buffer
    terminal = sys.stdout.isatty()
    if fmt is Format.auto:
        fmt = Format.table if terminal else Format.tsv
    with command_store() as store:
        if not write:
            store.read_only()
        for i, statement in enumerate(statements):
            if i and fmt in (Format.table, Format.tsv, Format.csv):
                out.write(b"\n")
            _one(store, statement, params or None, fmt, out, terminal)
    out.flush()


def _one(
    store: Store, query: str, params: Mapping[str, Any] | None, fmt: Format, out: BinaryIO, terminal: bool
) -> None:
    """Run one statement and write its result in ``fmt`` (control characters escaped on a terminal)."""
    if format_clause(query) or fmt is Format.tsv:  # ClickHouse's own bytes (TSV: TabSeparatedWithNames)
        chunks = store.query_raw(query, params)
        for chunk in terminal_bytes(chunks) if terminal else chunks:
            out.write(chunk)
            out.flush()
        return
    result = _times_as_text(store.query_arrow(query, params))
    names = result.column_names
    rows = list(zip(*(c.to_pylist() for c in result.columns), strict=True)) if names else []
    if fmt is Format.csv:
        import io

        text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
        writer = csv.writer(text)
        safe = terminal_text if terminal else str
        writer.writerow([safe(n) for n in names])
        writer.writerows(
            [[safe(tsv_escape(v) if v is None or not isinstance(v, str) else v) for v in r] for r in rows]
        )
        text.detach()
    elif fmt in (Format.json, Format.jsonl):
        lines = _json_rows(names, rows)
        if terminal:  # JSON escapes C0 already; DEL and C1 characters it writes as they are
            lines = terminal_bytes(lines)
        if fmt is Format.jsonl:
            for line in lines:
                out.write(line + b"\n")
        else:
            out.write(b"[" + b",".join(lines) + b"]\n")
    else:
        from rich.table import Column, Table
        from rich.text import Text

        # Text, not str: a name like "[bold]" is data, not rich markup
        table = Table(*(Column(header=Text(terminal_text(n))) for n in names), caption=f"{len(rows)} row(s)")
        for r in rows:
            table.add_row(*(Text(terminal_text(tsv_escape(_shown(v)))) for v in r))
        console.print(table)
