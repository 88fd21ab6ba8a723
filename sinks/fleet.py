"""The fleet view's queries: per host, what it hosted and what implicated it, over a window.

Reads the rollups of migration 008 (``node_hours``, ``anomaly_nodes``, ``gpu_health_daily``),
never the step rows, so a week of a 10,000-host fleet answers in well under a second::

    nodes = node_table(store, since, until, causes=NODE_CAUSES, kinds=NODE_SUSPECT_KINDS)
    nodes.hosts, nodes.gpu_hours, nodes.jobs        # one entry per host
    evidence = node_evidence(store, since, until, ["gpu-node-0042"], causes=..., kinds=...)
    lost_by_cause_day(store, since, until)           # the fleet's GPU-hours lost

What counts as implicating (the causes, the suspect kinds) is the caller's: the model lives
in ``argus.detectors.fleet``, and sinks do not import detectors. Times are datetimes (UTC when
naive); the window is ``since <= time < until``. The health counters are per day: a window
covers the whole days it touches.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from .store import Store

__all__ = [
    "THROTTLE_MASK",
    "HostEvidence",
    "LostByDay",
    "NodeTable",
    "lost_by_cause_day",
    "node_evidence",
    "node_table",
]

THROTTLE_MASK = 0xE8
"""NVML clock-event reasons counted as throttling (hardware slowdown, software and hardware
thermal slowdown, hardware power brake), as ``gpu_health_daily`` counts them (232)."""

_LATEST = """
    SELECT host, id, any(job) AS a_job, any(cause) AS a_cause,
           sum(gpu_hours_lost) AS lost, groupUniqArray(gpu_uuid) AS gpus
    FROM anomaly_nodes FINAL
    WHERE time >= {since:DateTime64(3)} AND time < {until:DateTime64(3)}
      AND has(splitByChar(',', {causes:String}), toString(cause))
      AND has(splitByChar(',', {kinds:String}), toString(suspect_kind)) {hosts_filter}
    GROUP BY host, id
"""
"""One row per (host, anomaly): its latest version, the host's share of its cost, its GPUs."""


@dataclass(frozen=True)
class NodeTable:
    """Per host (one entry each, sorted by name): GPU-hours hosted, distinct jobs and
    anomalies that implicated it, GPU-hours those cost (its share), and health events."""

    hosts: np.ndarray
    gpu_hours: np.ndarray
    jobs: np.ndarray
    anomalies: np.ndarray
    gpu_hours_lost: np.ndarray
    xid_samples: np.ndarray
    ecc_errors: np.ndarray
    throttled_samples: np.ndarray
    link_errors: np.ndarray

    def __len__(self) -> int:
        return len(self.hosts)

    def index(self, host: str) -> int:
        """The position of ``host`` (ValueError when absent)."""
        i = int(np.searchsorted(self.hosts, host))
        if i >= len(self.hosts) or self.hosts[i] != host:
            raise ValueError(f"no host {host!r} in the window")
        return i


@dataclass(frozen=True)
class HostEvidence:
    """What implicated one host: jobs, classes (anomalies per cause), GPUs (distinct jobs per
    GPU), the anomalies' ids (costliest first) and the XIDs its GPUs reported."""

    host: str
    jobs: tuple[str, ...]
    causes: dict[str, int]
    gpus: dict[str, int]
    ids: tuple[str, ...]
    xids: tuple[int, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class LostByDay:
    """The fleet's GPU-hours lost per day and cause (every anomaly once, latest version)."""

    day: str
    cause: str
    anomalies: int
    gpu_hours_lost: float


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _names(values: Iterable[str]) -> str:
    """Names as one comma-separated parameter (``splitByChar`` in the query): one binding that
    chDB and a server read alike."""
    out = sorted(str(v) for v in values)
    bad = [v for v in out if "," in v or not v]
    if bad:
        raise ValueError(f"a name in the fleet view may not be empty or hold a comma: {bad[0]!r}")
    return ",".join(out)


def _window(since: datetime, until: datetime) -> dict[str, Any]:
    since, until = _utc(since), _utc(until)
    if until <= since:
        raise ValueError(f"the window ends ({until}) before it starts ({since})")
    return {"since": since.replace(tzinfo=None), "until": until.replace(tzinfo=None)}


def node_table(
    store: Store, since: datetime, until: datetime, *, causes: Iterable[str], kinds: Iterable[str]
) -> NodeTable:
    """Every host that hosted steps or was implicated in ``[since, until)``.

    ``causes`` and ``kinds``: the anomaly causes and suspect kinds that implicate a node."""
    p = {**_window(since, until), "causes": _names(causes), "kinds": _names(kinds)}
    hours = store.query_rows(
        "SELECT host, sum(gpu_ms) / 3.6e6 FROM node_hours "
        "WHERE hour >= toStartOfHour({since:DateTime64(3)}) AND hour < {until:DateTime64(3)} GROUP BY host",
        p,
    )
    hit = store.query_rows(
        "SELECT host, uniqExact(a_job), count(), sum(lost) FROM ("
        + _LATEST.replace("{hosts_filter}", "")
        + ") GROUP BY host",
        p,
    )
    health = store.query_rows(
        """SELECT host, sum(xs), sum(ecc), sum(thr), sum(link) FROM (
               SELECT host, gpu_uuid, sum(xid_samples) AS xs, max(ecc_max) - min(ecc_min) AS ecc,
                      sum(throttled) AS thr, max(link_err_max) - min(link_err_min) AS link
               FROM gpu_health_daily
               WHERE day >= toDate({since:DateTime64(3)}) AND day <= toDate({until:DateTime64(3)})
               GROUP BY host, gpu_uuid)
           GROUP BY host""",
        p,
    )
    hosts = np.array(sorted({str(r[0]) for r in (*hours, *hit, *health)}), dtype=object)

    def column(rows: Sequence[tuple[Any, ...]], pos: int, dtype: type) -> np.ndarray:
        out: np.ndarray = np.zeros(len(hosts), dtype=dtype)
        if rows:
            idx = np.searchsorted(hosts, np.array([str(r[0]) for r in rows], dtype=object))
            out[idx] = [r[pos] for r in rows]
        return out

    return NodeTable(
        hosts,
        column(hours, 1, float),
        column(hit, 1, np.int64),
        column(hit, 2, np.int64),
        column(hit, 3, float),
        column(health, 1, np.int64),
        column(health, 2, np.int64),
        column(health, 3, np.int64),
        column(health, 4, np.int64),
    )


def node_evidence(
    store: Store,
    since: datetime,
    until: datetime,
    hosts: Sequence[str],
    *,
    causes: Iterable[str],
    kinds: Iterable[str],
    max_ids: int = 10,
) -> dict[str, HostEvidence]:
    """The evidence of a few hosts (the suspects): their jobs, classes, GPUs, anomaly ids."""
    if not hosts:
        return {}
    p = {**_window(since, until), "causes": _names(causes), "kinds": _names(kinds), "hosts": _names(hosts)}
    rows = store.query_rows(
        "SELECT host, groupUniqArray(a_job), "
        "groupArray(a_cause), groupArray(lost), groupArray(id), groupArray(gpus), groupArray(a_job) FROM ("
        + _LATEST.replace("{hosts_filter}", "AND has(splitByChar(',', {hosts:String}), toString(host))")
        + ") GROUP BY host",
        p,
    )
    xids = dict(
        store.query_rows(
            "SELECT host, groupUniqArrayArray(xids) FROM gpu_health_daily "
            "WHERE has(splitByChar(',', {hosts:String}), toString(host)) AND day >= toDate({since:DateTime64(3)}) "
            "AND day <= toDate({until:DateTime64(3)}) GROUP BY host",
            p,
        )
    )
    out: dict[str, HostEvidence] = {}
    for host, jobs, *columns in rows:
        items = list(zip(*columns, strict=True))  # (cause, lost, id, gpus, job) per anomaly
        by_cause: dict[str, int] = {}
        gpu_jobs: dict[str, set[str]] = {}
        for cause, _, _, gpus, job in items:
            by_cause[cause] = by_cause.get(cause, 0) + 1
            for g in gpus:
                gpu_jobs.setdefault(str(g), set()).add(job)
        ids = tuple(str(i[2]) for i in sorted(items, key=lambda i: -float(i[1]))[:max_ids])
        out[str(host)] = HostEvidence(
            str(host),
            tuple(sorted(str(j) for j in jobs)),
            dict(sorted(by_cause.items(), key=lambda kv: -kv[1])),
            {g: len(j) for g, j in sorted(gpu_jobs.items(), key=lambda kv: -len(kv[1]))},
            ids,
            tuple(sorted(int(x) for x in xids.get(host, ()))),
        )
    return out


def lost_by_cause_day(
    store: Store, since: datetime, until: datetime, *, causes: Iterable[str] | None = None
) -> list[LostByDay]:
    """The fleet's GPU-hours lost per day and cause: every anomaly once, its latest version,
    dated by when it was detected; only ``causes`` when given."""
    p = _window(since, until)
    where = ""
    if causes is not None:
        p["causes"] = _names(causes)
        where = "AND has(splitByChar(',', {causes:String}), toString(cause))"
    rows = store.query_rows(
        f"""SELECT toDate(time) AS day, cause, count(), sum(gpu_hours_lost)
            FROM anomalies FINAL
            WHERE time >= {{since:DateTime64(3)}} AND time < {{until:DateTime64(3)}} {where}
            GROUP BY day, cause ORDER BY day, cause""",
        p,
    )
    return [LostByDay(str(d), str(c), int(n), float(g)) for d, c, n, g in rows]
