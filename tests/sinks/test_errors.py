"""sinks/_errors.py: one error root for the package."""

from __future__ import annotations

from datetime import UTC, datetime

import argus.sinks as sinks
from argus.sinks import grafana
from argus.sinks.grafana import MacroError, expand


def test_every_error_the_package_exports_is_a_sink_error() -> None:
    exported = [getattr(m, n) for m in (sinks, grafana) for n in m.__all__]
    errors = {e for e in exported if isinstance(e, type) and issubclass(e, Exception)}
    assert {sinks.GrafanaPushError, MacroError, sinks.QueryError} <= errors
    assert all(issubclass(e, sinks.SinkError) for e in errors), errors


def test_a_macro_error_is_caught_at_the_root_and_as_a_value_error() -> None:
    for root in (sinks.SinkError, ValueError):
        try:
            now = datetime(2026, 1, 2, tzinfo=UTC)
            expand("SELECT $__nope()", start=now, end=now, interval_s=60)
        except root as exc:
            assert isinstance(exc, MacroError)
        else:
            raise AssertionError("an unknown macro expanded")
