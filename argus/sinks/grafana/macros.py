"""Expand Grafana's template variables and the ClickHouse datasource plugin's macros.

Grafana expands these before a query reaches ClickHouse; Argus expands them the same way
to run every panel's and alert rule's SQL in tests and in ``argus report``. Supported:

- ``$__timeFilter(col)``, ``$__timeFilter_ms(col)``, ``$__fromTime``, ``$__toTime``,
  ``$__fromTime_ms``, ``$__toTime_ms``, ``$__timeInterval(col)``, ``$__timeInterval_ms(col)``,
  ``$__interval_s`` (as the grafana-clickhouse-datasource v4 plugin writes them);
- ``${name}``, ``$name`` and ``${name:percentencode}`` variables. Dashboards use only the
  percent-encoded form inside ``decodeURLComponent('...')``: the encoding leaves nothing but
  ``[A-Za-z0-9_.~%-]``, so no value (``x'; DROP TABLE steps; --``) can end the string.

An unknown macro or an unset variable is an error, so a typo fails the tests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from urllib.parse import quote

from .._errors import MacroError

__all__ = ["MacroError", "expand", "percent_encode"]


def percent_encode(value: str) -> str:
    """Grafana's ``percentencode`` format (``encodeURIComponentStrict``, RFC 3986)."""
    return quote(value, safe="-_.~")


def _seconds(t: datetime) -> int:
    return int(t.timestamp())


def _millis(t: datetime) -> int:
    return int(t.timestamp() * 1000)


_FUNC = re.compile(r"\$__(timeFilter_ms|timeFilter|timeInterval_ms|timeInterval)\(\s*([^()]+?)\s*\)")
_PLAIN = re.compile(r"\$__(fromTime_ms|toTime_ms|fromTime|toTime|interval_s)\b")
_VAR = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)")


def expand(
    sql: str,
    *,
    start: datetime,
    end: datetime,
    interval_s: int,
    variables: Mapping[str, str] | None = None,
) -> str:
    """The SQL Grafana would send for this time range, interval and variable values."""
    if interval_s <= 0:
        raise MacroError("interval_s must be positive")
    variables = variables or {}

    def func(m: re.Match[str]) -> str:
        name, col = m.group(1), m.group(2)
        if name == "timeFilter":
            return f"{col} >= toDateTime({_seconds(start)}) AND {col} <= toDateTime({_seconds(end)})"
        if name == "timeFilter_ms":
            return (
                f"{col} >= fromUnixTimestamp64Milli({_millis(start)}) AND "
                f"{col} <= fromUnixTimestamp64Milli({_millis(end)})"
            )
        if name == "timeInterval":
            return f"toStartOfInterval(toDateTime({col}), INTERVAL {interval_s} second)"
        return f"toStartOfInterval(toDateTime64({col}, 3), INTERVAL {interval_s * 1000} millisecond)"

    def plain(m: re.Match[str]) -> str:
        return {
            "fromTime": f"toDateTime({_seconds(start)})",
            "toTime": f"toDateTime({_seconds(end)})",
            "fromTime_ms": f"fromUnixTimestamp64Milli({_millis(start)})",
            "toTime_ms": f"fromUnixTimestamp64Milli({_millis(end)})",
            "interval_s": str(interval_s),
        }[m.group(1)]

    out = _PLAIN.sub(plain, _FUNC.sub(func, sql))
    leftover = re.search(r"\$__\w+", out)
    if leftover:
        raise MacroError(f"unknown macro {leftover.group(0)}")

    def var(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        fmt = m.group(2)
        if name not in variables:
            raise MacroError(f"variable ${name} has no value")
        value = variables[name]
        if fmt is None:
            return value
        if fmt == "percentencode":
            return percent_encode(value)
        raise MacroError(f"variable format {fmt!r} is not supported")

    return _VAR.sub(var, out)
