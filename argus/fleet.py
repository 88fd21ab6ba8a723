"""The fleet view: the store's per-host figures (``argus.sinks.fleet``) judged by the fleet
model (``argus.detectors.fleet``), with each suspect's evidence. A host is a suspect on any
of three kinds of evidence: the jobs whose anomalies implicated it (per GPU-hour hosted), a
GPU's NVML health corroborated by the jobs that named it, or a GPU slower than its job peers
in job after job (no anomaly needed: what a small job takes for its baseline). ``argus
fleet``, the bench and the dashboard's alert read the same suspects::

    view = fleet_view(store, until=now, since=now - timedelta(days=7))
    for node in view.suspects: node.host, node.confidence, node.evidence.ids
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from argus.detectors.fleet import (
    HEALTH_SIGNALS,
    NODE_CAUSES,
    NODE_SUSPECT_KINDS,
    FleetConfig,
    corroborate,
    health_test,
    node_health,
    slow_test,
)
from argus.schemas.causes import COMPUTE_STRAGGLER, MASKED_COMPUTE_STRAGGLER
from argus.sinks.fleet import (
    HostEvidence,
    LostByDay,
    NodeTable,
    gpu_detail,
    gpu_names,
    host_health,
    lost_by_cause_day,
    node_evidence,
    node_table,
    record_suspects,
    slow_gpus,
)
from argus.sinks.store import Store

__all__ = [
    "SLOWER_THAN_PEERS",
    "FleetView",
    "SuspectNode",
    "fleet_view",
    "parse_since",
    "record",
    "slow_summary",
]

SLOWER_THAN_PEERS = "slower than its job peers"
"""``decided_by`` of a host named because one of its GPUs was the slow one in job after job
(followed by ``on <GPU>``)."""

_SLOW_CAUSES = frozenset({COMPUTE_STRAGGLER, MASKED_COMPUTE_STRAGGLER})
"""With ``--cause``, the causes whose view also weighs a GPU slower than its job peers (that
slowness is a compute straggler's, when the diagnosis reports it)."""

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
    would have had there (the evidence lists every job). A node named on its health instead
    (``decided_by`` ``"<signal> on <GPU>"``, e.g. ``throttled on GPU-...``): ``jobs`` and
    ``expected`` are that GPU's, ``ratio_low`` its rate over a healthy GPU's, ``confidence``
    1 - the larger of the health test's and the jobs test's adjusted p-values. A node named as
    slower than its job peers (``decided_by`` ``"slower than its job peers on <GPU>"``): ``jobs``
    the jobs in which that GPU was the slow one, ``expected`` those of a healthy GPU that
    hosted as many, ``ratio_low`` its share of slow jobs over the fleet's at the 95 % bound,
    ``confidence`` 1 - the Holm-adjusted p-value over the GPUs judged. Whatever named it,
    ``evidence.slow_gpus`` holds its GPUs' slowness against their peers.
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
            "slower_than_peers": slow_summary(ev),
            "slow_gpus": {
                g: {"slow_jobs": k, "jobs": n, "excess_median": x} for g, (k, n, x) in ev.slow_gpus.items()
            },
        }


def slow_summary(evidence: HostEvidence) -> str:
    """The host's GPUs slower than their job peers, as one line: ``GPU-…: slower than its job
    peers in 5 of 6 jobs, +11 % median`` (most slow jobs first, ``; `` between GPUs); empty
    when none was."""
    return "; ".join(
        f"{g}: {SLOWER_THAN_PEERS} in {k} of {n} jobs, +{x * 100:.0f} % median"
        for g, (k, n, x) in evidence.slow_gpus.items()
    )


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
    named = [
        (
            str(table.hosts[i]),
            float(health.confidence[i]),
            float(health.ratio_low[i]),
            int(health.count[i]),
            float(health.expected[i]),
            strata[int(health.stratum[i])],
            float(table.gpu_hours[i]),
        )
        for i in order
    ]
    named += _named_on_health(store, since, until, causes, table, {n[0] for n in named}, config)
    slow_named, slow_of = _named_slower(store, since, until, table, {n[0] for n in named}, config)
    if cause is None or cause in _SLOW_CAUSES:
        seen = {n[0] for n in named}
        named += [n for n in slow_named if n[0] not in seen]
    evidence = node_evidence(
        store, since, until, [n[0] for n in named], causes=causes, kinds=NODE_SUSPECT_KINDS, max_ids=max_ids
    )
    suspects = [
        SuspectNode(
            *n, dataclasses.replace(evidence.get(n[0], HostEvidence(n[0])), slow_gpus=slow_of.get(n[0], {}))
        )
        for n in named
    ]
    lost = lost_by_cause_day(store, since, until, causes=None if cause is None else [cause])
    return FleetView(
        since, until, cause, float(health.rate[0]), len(table), float(table.gpu_hours.sum()), suspects, lost
    )


def _named_on_health(
    store: Store,
    since: datetime,
    until: datetime,
    causes: frozenset[str],
    table: NodeTable,
    named: set[str],
    config: FleetConfig | None,
) -> list[tuple[str, float, float, int, float, str, float]]:
    """The hosts the health test flags whose flagged GPU the jobs corroborate (and the job
    counts alone did not name), most confident first: (host, confidence, ratio_low, jobs,
    expected, decided_by, GPU-hours hosted) each."""
    hh = host_health(store, since, until)
    test = health_test(hh.events, hh.samples, config)
    flagged = {str(hh.hosts[i]): i for i in np.flatnonzero(test.flagged) if str(hh.hosts[i]) not in named}
    if not flagged:
        return []
    # a healthy GPU's rate: the fleet's job-GPU pairs per GPU-hour, without the flagged hosts
    # and the suspects (bad nodes must not raise the bar)
    keep = np.array([str(h) not in flagged and str(h) not in named for h in table.hosts], bool)
    hours = float(table.gpu_hours[keep].sum())
    rate = float(table.gpu_jobs[keep].sum()) / hours if hours > 0.0 else 0.0
    gpus = gpu_detail(store, since, until, sorted(flagged), causes=causes, kinds=NODE_SUSPECT_KINDS)
    per_host: dict[str, int] = {}
    for d in gpus:
        per_host[d.host] = per_host.get(d.host, 0) + 1
    tested = []  # each flagged host's GPUs that showed its deciding signal
    for d in gpus:
        i = flagged[d.host]
        if d.events[int(test.signal[i])] > 0:
            tested.append((d, i))
    if not tested:
        return []
    host_hours = {str(h): float(g) for h, g in zip(table.hosts, table.gpu_hours, strict=True)}
    exposure = np.array([host_hours.get(d.host, 0.0) / per_host[d.host] for d, _ in tested])
    corr = corroborate(np.array([d.jobs for d, _ in tested]), exposure, rate, config)
    best: dict[str, tuple[str, float, float, int, float, str, float]] = {}
    for j, (d, i) in enumerate(tested):
        if not corr.suspect[j]:
            continue
        confidence = 1.0 - max(float(test.p_adjusted[i]), float(corr.p_adjusted[j]))
        row = (
            d.host,
            confidence,
            float(corr.ratio_low[j]),
            d.jobs,
            float(corr.expected[j]),
            f"{HEALTH_SIGNALS[int(test.signal[i])]} on {d.gpu}",
            host_hours.get(d.host, 0.0),
        )
        if d.host not in best or row[1] > best[d.host][1]:
            best[d.host] = row
    return sorted(best.values(), key=lambda r: (-r[1], -r[2], r[0]))


def _named_slower(
    store: Store,
    since: datetime,
    until: datetime,
    table: NodeTable,
    named: set[str],
    config: FleetConfig | None,
) -> tuple[
    list[tuple[str, float, float, int, float, str, float]], dict[str, dict[str, tuple[int, int, float]]]
]:
    """The hosts with a GPU slower than its job peers in improbably many of its jobs
    (:func:`~argus.detectors.fleet.slow_test`), most confident first, as (host, confidence,
    ratio_low, slow jobs, expected, decided_by, GPU-hours hosted); and per host among those
    and ``named`` (the suspects on other evidence), its GPUs that were slow in some job:
    (slow jobs, jobs judged, median excess), most slow jobs first."""
    cfg = config or FleetConfig()
    slow = slow_gpus(
        store,
        since,
        until,
        slow_frac=cfg.slow_frac,
        min_steps=cfg.slow_min_steps,
        min_peers=cfg.slow_min_peers,
    )
    test = slow_test(slow.slow, slow.jobs, cfg, others=slow.others, others_jobs=slow.others_jobs)
    suspects = [int(i) for i in np.flatnonzero(test.suspect)]
    names = gpu_names(store, since, until, slow, suspects, named)
    of: dict[str, dict[str, tuple[int, int, float]]] = {}
    for i in sorted(range(len(slow.keys)), key=lambda i: (-slow.slow[i], test.p_value[i])):
        if int(slow.keys[i]) in names:
            host, gpu = names[int(slow.keys[i])]
            of.setdefault(host, {})[gpu] = (int(slow.slow[i]), int(slow.jobs[i]), float(slow.excess[i]))
    host_hours = {str(h): float(g) for h, g in zip(table.hosts, table.gpu_hours, strict=True)}
    best: dict[str, tuple[str, float, float, int, float, str, float]] = {}
    for i in suspects:
        host, gpu = names.get(int(slow.keys[i]), (f"gpu-key-{int(slow.keys[i])}", "?"))
        row = (
            host,
            float(test.confidence[i]),
            float(test.ratio_low[i]),
            int(slow.slow[i]),
            float(test.expected[i]),
            f"{SLOWER_THAN_PEERS} on {gpu}",
            host_hours.get(host, 0.0),
        )
        if host not in best or (row[1], row[2]) > (best[host][1], best[host][2]):
            best[host] = row
    return sorted(best.values(), key=lambda r: (-r[1], -r[2], r[0])), of


def record(store: Store, view: FleetView) -> int:
    """Store the view's suspects in ``node_suspects`` (for the dashboard and the alert rule),
    recorded at the view's end; returns how many."""
    return record_suspects(store, view.until, view.since, [n.row() for n in view.suspects])
