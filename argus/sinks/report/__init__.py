"""``argus report``: one self-contained HTML page about one job.

Reads the store with the dashboards' own SQL (``sinks.grafana.queries``), draws the plots
as inline SVG, and escapes every value::

    from argus.sinks.report import build_report
    html = build_report(store, "job-42")
"""

from __future__ import annotations

from datetime import datetime

from ..store import Store
from ._data import ReportData, Suspect, Table, UnknownJobError, collect
from ._html import render

__all__ = ["ReportData", "Suspect", "Table", "UnknownJobError", "build_report", "collect", "render"]


def build_report(store: Store, job: str, *, now: datetime | None = None) -> str:
    """The HTML report of ``job`` (raises :class:`UnknownJobError` if the store has no steps of it)."""
    return render(collect(store, job, now=now))
