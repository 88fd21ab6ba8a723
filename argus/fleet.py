"""The fleet view: the store's per-host figures (``argus.sinks.fleet``) judged by the fleet
model (``argus.detectors.fleet``), with each suspect's evidence. ``argus fleet``, the bench
and the dashboard's alert read the same suspects::

    view = fleet_view(store, until=now, since=now - timedelta(days=7))
    for node in view.suspects: node.host, node.confidence, node.evidence.ids
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from argus.detectors.fleet import NODE_CAUSES, NODE_SUSPECT_KINDS, FleetConfig, node_health
from argus.sinks.fleet import (
    HostEvidence,
    LostByDay,
    lost_by_cause_day,
    node_evidence,
    node_table,
    record_suspects,
)
from argus.sinks.store import Store

__all__ = ["FleetView", "SuspectNode", "fleet_view", "parse_since", "record"]

_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: datetime) -> datetime:
    """``7d``, ``36h``, ``90m``, ``2w`` before ``now``, or an ISO 8601 time (UTC if no zone)."""
    m = _SPAN.match(text)
    if m:
        span = timedelta(seconds=float(m.group(1)) * _UNIT[m.group(2)])
        if span <= timedelta(0):
            raise ValueError(f"--since must be a positive span, got {text!r}")
        return now - span
    try:
        t = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--since wants a span (7d, 36h, 90m, 2w) or an ISO time, got {text!r}") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


@dataclass(frozen=True)
class SuspectNode:
    """One suspect host with the test's figures and its evidence.

    ``confidence``: 1 - the Holm-adjusted p-value over the fleet (the chance that a healthy
    node would look this bad, for the whole fleet at once, is at most 1 - confidence);
    ``ratio_low``: its rate is at least this many times the fleet's (95 % posterior bound);
    ``jobs``: the jobs that implicated it in ``decided_by`` (``any`` node cause, or the one
    cause in which it stands out most), ``expected``: those a healthy node with its exposure
    would have had there (the evidence lists every job).
    """

    host: str
    confidence: float
    ratio_low: float
    jobs: int
    expected: float
    decided_by: str
    gpu_hours: float
    evidence: HostEvidence

    def row(self) -> dict[str, Any]:
        """The suspect as one flat record: ``argus fleet``'s TSV and JSON, ``node_suspects``."""
        ev = self.evidence
        return {
            "host": self.host,
            "confidence": self.confidence,
            "rate_x_fleet_min": self.ratio_low,
            "jobs": self.jobs,
            "jobs_expected": self.expected,
            "decided_by": self.decided_by,
            "anomalies": ev.anomalies,
            "gpu_hours_hosted": self.gpu_hours,
            "gpu_hours_lost": ev.gpu_hours_lost,
            "causes": ev.causes,
            "gpus": ev.gpus,
            "xid_samples": ev.xid_samples,
            "ecc_errors": ev.ecc_errors,
            "throttled_samples": ev.throttled_samples,
            "link_errors": ev.link_errors,
            "xids": list(ev.xids),
            "jobs_list": list(ev.jobs),
            "anomaly_ids": list(ev.ids),
        }


@dataclass(frozen=True)
class FleetView:
    """Suspects ranked, the fleet's rate and the GPU-hours lost by day and cause."""

    since: datetime
    until: datetime
    cause: str | None
    rate: float
    nodes: int
    gpu_hours: float
    suspects: list[SuspectNode]
    lost: list[LostByDay]


def fleet_view(
    store: Store,
    *,
    since: datetime,
    until: datetime,
    cause: str | None = None,
    config: FleetConfig | None = None,
    max_ids: int = 10,
) -> FleetView:
    """The fleet view of ``[since, until)``: only anomalies of ``cause`` when given (one of
    :data:`~argus.detectors.fleet.NODE_CAUSES`: the fleet rate is then that cause's)."""
    if cause is not None and cause not in NODE_CAUSES:
        raise ValueError(f"{cause!r} never implicates a node; one of: {', '.join(sorted(NODE_CAUSES))}")
    causes = NODE_CAUSES if cause is None else frozenset({cause})
    table = node_table(store, since, until, causes=causes, kinds=NODE_SUSPECT_KINDS)
    # strata: any node cause, then each cause seen (a bad node keeps failing one way)
    strata = ("any", *table.causes) if cause is None and len(table.causes) > 1 else ("any",)
    counts = np.column_stack([table.jobs, table.by_cause]) if len(strata) > 1 else table.jobs
    health = node_health(counts, table.gpu_hours, config)
    order = [int(i) for i in health.order() if health.suspect[i]]
    hosts = [str(table.hosts[i]) for i in order]
    evidence = node_evidence(
        store, since, until, hosts, causes=causes, kinds=NODE_SUSPECT_KINDS, max_ids=max_ids
    )
    suspects = [
        SuspectNode(
            str(table.hosts[i]),
            float(health.confidence[i]),
            float(health.ratio_low[i]),
            int(health.count[i]),
            float(health.expected[i]),
            strata[int(health.stratum[i])],
            float(table.gpu_hours[i]),
            evidence.get(str(table.hosts[i]), HostEvidence(str(table.hosts[i]))),
        )
        for i in order
    ]
    lost = lost_by_cause_day(store, since, until, causes=None if cause is None else [cause])
    return FleetView(
        since, until, cause, float(health.rate[0]), len(table), float(table.gpu_hours.sum()), suspects, lost
    )


def record(store: Store, view: FleetView) -> int:
    """Store the view's suspects in ``node_suspects`` (for the dashboard and the alert rule),
    recorded at the view's end; returns how many."""
    return record_suspects(store, view.until, view.since, [n.row() for n in view.suspects])
