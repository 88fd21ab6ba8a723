"""The fleet view's queries: per host, what it hosted and what implicated it, over a window.

Reads the rollups of migrations 008 to 011 (``node_days``, ``node_hours``, ``node_jobs``,
``anomaly_nodes``, ``gpu_health_daily``, ``rank_work_days``), never the step rows; what runs over every host
reads ``node_days`` (and the end hours of ``node_hours``), ``node_jobs`` and
``gpu_health_daily`` grouped by host alone (or by host and cause), and what
reads ``anomaly_nodes`` or one GPU at a time is for a few hosts (the tables are sorted by
host), so a month of a 10,000-host fleet answers in well under a second::

    nodes = node_table(store, since, until, causes=NODE_CAUSES, kinds=NODE_SUSPECT_KINDS)
    nodes.hosts, nodes.gpu_hours, nodes.jobs        # one entry per host
    health = host_health(store, since, until)        # NVML events per host and signal
    gpus = gpu_detail(store, since, until, ["gpu-node-0042"], causes=..., kinds=...)
    evidence = node_evidence(store, since, until, ["gpu-node-0042"], causes=..., kinds=...)
    lost_by_cause_day(store, since, until)           # the fleet's GPU-hours lost
    slow = slow_gpus(store, since, until, slow_frac=0.08, min_steps=50, min_peers=4)
    slow.keys, slow.jobs, slow.slow                  # GPUs ever slower than their job peers
    gpu_names(store, since, until, slow, [0, 1])     # {key: (host, GPU uuid)}

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
import pyarrow as pa

from .store import Store

__all__ = [
    "THROTTLE_MASK",
    "GpuDetail",
    "HostEvidence",
    "HostHealth",
    "LostByDay",
    "NodeTable",
    "SlowGpus",
    "gpu_detail",
    "gpu_names",
    "host_health",
    "lost_by_cause_day",
    "node_evidence",
    "node_table",
    "record_suspects",
    "slow_gpus",
]

THROTTLE_MASK = 0xE8
"""NVML clock-event reasons counted as throttling (hardware slowdown, software and hardware
thermal slowdown, hardware power brake), as ``gpu_health_daily`` counts them (232)."""

_IMPLICATING = """time >= {since:DateTime64(3)} AND time < {until:DateTime64(3)}
      AND cause IN splitByChar(',', {causes:String}) AND suspect_kind IN splitByChar(',', {kinds:String})"""
"""The anomaly_nodes rows of the window that implicate their host (the caller's causes and
kinds). ``IN`` a constant set, not ``has()``: on a LowCardinality column it is decided once
per distinct value, and on ``host`` it reads only the hosts' ranges of the sort key."""

_IMPLICATING_HOURS = """hour >= toStartOfHour({since:DateTime64(3)}) AND hour < {until:DateTime64(3)}
      AND cause IN splitByChar(',', {causes:String}) AND suspect_kind IN splitByChar(',', {kinds:String})"""
"""The node_jobs rows of the window's hours (as node_hours counts exposure) that implicate
their host."""

_MINE = "host IN splitByChar(',', {hosts:String})"

_FIRST_DAY = """if(toStartOfDay(toStartOfHour({since:DateTime64(3)})) = toStartOfHour({since:DateTime64(3)}),
       toDate(toStartOfHour({since:DateTime64(3)})), toDate(toStartOfHour({since:DateTime64(3)})) + 1)"""
_LAST_HOUR = "({until:DateTime64(3)} - INTERVAL 23 HOUR)"
_END_DAY = f"if(toStartOfDay({_LAST_HOUR}) = {_LAST_HOUR}, toDate({_LAST_HOUR}), toDate({_LAST_HOUR}) + 1)"
_EXPOSURE = f"""SELECT host, sum(ms) / 3.6e6 FROM (
        SELECT host, gpu_ms AS ms FROM node_days WHERE day >= {_FIRST_DAY} AND day < {_END_DAY}
        UNION ALL
        SELECT host, gpu_ms AS ms FROM node_hours
        WHERE hour >= toStartOfHour({{since:DateTime64(3)}}) AND hour < {{until:DateTime64(3)}}
          AND NOT (hour >= toDateTime({_FIRST_DAY}) AND hour < toDateTime({_END_DAY})))
    GROUP BY host"""
"""GPU-hours per host over the hours that start in the window (``node_hours``' hours from the
one holding ``since`` to the last before ``until``): the whole days among them from
``node_days`` (a day is whole when its first hour is in and its last starts before
``until``), the hours at the two ends from ``node_hours`` (their partitions only)."""

_DAYS = "day >= toDate({since:DateTime64(3)}) AND day <= toDate({until:DateTime64(3)})"


@dataclass(frozen=True)
class NodeTable:
    """Per host (one entry each, sorted by name): GPU-hours hosted and the distinct jobs whose
    anomalies implicated it, of any cause (``jobs``) and per cause (``by_cause``, one column
    per name of ``causes``): what the fleet model needs of every host. ``gpu_jobs``: the
    job-GPU pairs among them (a job naming two of its GPUs counts twice), an upper bound (a
    job's rows of several hours or causes count its GPUs again): a healthy GPU's share."""

    hosts: np.ndarray
    gpu_hours: np.ndarray
    jobs: np.ndarray
    causes: tuple[str, ...] = ()
    by_cause: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64))
    gpu_jobs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

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
    """What implicated one host: its jobs, anomalies (each once, latest version) and the
    GPU-hours they cost (its share), classes (anomalies per cause), GPUs (distinct jobs per
    GPU), the anomalies' ids (costliest first); and its GPUs' NVML health over the window's
    days: samples with an XID (and which), samples throttled, the rise of the ECC double-bit
    and NVLink error counters. ``slow_gpus``: per GPU of the host that was slower than its job
    peers in some job of the window, (jobs slow, jobs judged, median excess over the slow ones);
    the fleet view fills it (:func:`slow_gpus`), ``node_evidence`` leaves it empty."""

    host: str
    jobs: tuple[str, ...] = ()
    anomalies: int = 0
    gpu_hours_lost: float = 0.0
    causes: dict[str, int] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)
    ids: tuple[str, ...] = ()
    xids: tuple[int, ...] = ()
    xid_samples: int = 0
    throttled_samples: int = 0
    ecc_errors: int = 0
    link_errors: int = 0
    slow_gpus: dict[str, tuple[int, int, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class HostHealth:
    """Per host (sorted by name): the health samples its GPUs sent over the window's days and
    its events per signal (columns: throttled samples, samples with an XID, and the rise of its
    GPUs' ECC double-bit and NVLink error counters over the window)."""

    hosts: np.ndarray
    samples: np.ndarray
    events: np.ndarray


@dataclass(frozen=True)
class GpuDetail:
    """One GPU of a host: its samples and events per signal over the window's days (counter
    rises over the whole window), and the distinct jobs whose anomalies named it."""

    host: str
    gpu: str
    samples: int
    events: tuple[int, int, int, int]
    jobs: int


@dataclass(frozen=True)
class LostByDay:
    """The fleet's GPU-hours lost per day and cause (every anomaly once, latest version)."""

    day: str
    cause: str
    anomalies: int
    gpu_hours_lost: float


@dataclass(frozen=True)
class SlowGpus:
    """Per GPU slower than its job peers in some job of the window (one entry each, sorted by
    ``keys``, its 64-bit hash ``cityHash64(host, gpu_uuid)``; names: :func:`gpu_names`):
    ``jobs`` it hosted with enough steps to judge (a job per day it ran), ``slow`` those in
    which its compute was ``slow_frac`` above its peers' median, ``excess`` the median of that
    excess over its slow jobs (0.11: 11 % slower), ``worst`` the largest. Every other GPU that
    hosted such a job was never the slow one: ``others`` of them, ``others_jobs`` job-days
    together. ``days`` and ``at`` (job key, stage): one job-day each was slow in, where
    :func:`gpu_names` reads its names."""

    keys: np.ndarray
    jobs: np.ndarray
    slow: np.ndarray
    excess: np.ndarray
    worst: np.ndarray
    others: int = 0
    others_jobs: int = 0
    days: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    at: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.uint64))

    def __len__(self) -> int:
        return len(self.keys)


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
    """Every host that hosted steps or was implicated in ``[since, until)``: its GPU-hours
    (whole hours: the hours that start in the window) and its implicating jobs.

    ``causes`` and ``kinds``: the anomaly causes and suspect kinds that implicate a node."""
    p = {**_window(since, until), "causes": _names(causes), "kinds": _names(kinds)}
    hours = store.query_rows(_EXPOSURE, p)
    # node_jobs: versions of one anomaly and a job's repeated anomalies share its row (or, not
    # merged yet, its job hash); grouped by host alone for any cause, by host and cause apart
    # (one key of a LowCardinality column groups far faster than two, or than WITH ROLLUP)
    anyc = store.query_rows(
        f"SELECT host, uniqExact(job_hash), sum(length(gpus)) FROM node_jobs WHERE {_IMPLICATING_HOURS} "
        "GROUP BY host",
        p,
    )
    hit = store.query_rows(
        f"SELECT host, toString(cause), uniqExact(job_hash) FROM node_jobs WHERE {_IMPLICATING_HOURS} "
        "GROUP BY host, cause",
        p,
    )
    hosts = np.array(sorted({str(r[0]) for r in (*hours, *anyc)}), dtype=object)
    causes = tuple(sorted({str(r[1]) for r in hit}))

    def column(rows: Sequence[tuple[Any, ...]], dtype: type) -> np.ndarray:
        out: np.ndarray = np.zeros(len(hosts), dtype=dtype)
        if rows:
            idx = np.searchsorted(hosts, np.array([str(r[0]) for r in rows], dtype=object))
            out[idx] = [r[-1] for r in rows]
        return out

    of_cause: dict[str, list[tuple[Any, ...]]] = {}
    for r in hit:
        of_cause.setdefault(str(r[1]), []).append(r)
    by_cause = np.zeros((len(hosts), len(causes)), np.int64)
    for j, c in enumerate(causes):
        by_cause[:, j] = column(of_cause[c], np.int64)
    total = column([r[:2] for r in anyc], np.int64)
    pairs = column([(r[0], r[2]) for r in anyc], np.int64)
    return NodeTable(hosts, column(hours, float), total, causes, by_cause, pairs)


_JUDGED = """day >= toDate({since:DateTime64(3)}) AND day <= toDate({until:DateTime64(3)})
          AND first_time < {until:DateTime64(3)} AND last_time >= {since:DateTime64(3)}
          AND steps >= {min_steps:UInt64} AND compute_sum > 0"""
"""The rank-days of ``rank_work_days`` in the window (their steps that day began before
``until`` and ended after ``since``) with enough steps to judge."""

_SLOW = f"""SELECT gk, count(), median(x), max(x), toString(any(d)), any(jk), any(p) FROM (
    SELECT sl.1 AS gk, sl.2 / m - 1.0 AS x, day AS d, job_key AS jk, pp AS p FROM (
        SELECT day, job_key, pp, groupArray(gpu_key) AS gs, groupArray(compute_sum / steps) AS ws,
               arraySort(ws) AS o, (o[intDiv(length(o) + 1, 2)] + o[intDiv(length(o), 2) + 1]) / 2 AS m,
               arrayFilter(t -> t.2 >= m * (1.0 + {{slow_frac:Float64}}) AND t.1 != 0, arrayZip(gs, ws)) AS slow
        FROM rank_work_days FINAL
        WHERE {_JUDGED}
        GROUP BY day, job_key, pp
        HAVING length(ws) >= {{min_peers:UInt64}} AND notEmpty(slow))
    ARRAY JOIN slow AS sl)
GROUP BY gk"""
"""Per GPU (its key) slower than its job peers in some job-day of the window: in how many, the
median and the largest excess, and one of those job-days (its sort key's day, job run and
stage: where to read its names). A rank's mean compute on a day against its peers' median (that day's ranks of its job
run and stage, at least ``min_peers`` with enough steps): only the slow ranks leave the first
grouping. Numbers only; ranks without a GPU uuid (key 0) are peers but counted for no GPU."""

_KEYS = "(SELECT toUInt64(arrayJoin(splitByChar(',', {keys:String}))))"
"""GPU keys as one comma-separated parameter."""

_JOB_DAYS = f"""SELECT if(gpu_key IN {_KEYS}, gpu_key, 0) AS gk,
       count(), uniqExact(gpu_key)
FROM rank_work_days FINAL
WHERE {_JUDGED} AND gpu_key != 0
GROUP BY gk"""
"""The job-days each GPU hosted with enough steps (its exposure): one row per GPU of ``keys``,
and one (key 0) for all the others together, with how many they are."""

_SLOW_NAMES = f"""SELECT gpu_key, toString(any(host)), toString(any(gpu_uuid)) FROM rank_work_days
WHERE (day, job_key, pp) IN (
    SELECT toDate(t[1]), toUInt64(t[2]), toUInt32(t[3])
    FROM (SELECT splitByChar(':', arrayJoin(splitByChar(',', {{rows:String}}))) AS t))
  AND gpu_key IN {_KEYS}
GROUP BY gpu_key"""
"""The names of GPUs by one of their job-days (a prefix of the table's sort key: a few
granules each)."""

_HOST_GPUS = """SELECT DISTINCT cityHash64(toString(host), toString(gpu_uuid)), toString(host), toString(gpu_uuid)
FROM gpu_health_daily WHERE host IN splitByChar(',', {hosts:String}) AND day >= toDate({since:DateTime64(3)})
  AND day <= toDate({until:DateTime64(3)})"""
"""The GPUs of a few hosts, keyed as ``rank_work_days`` keys them, from their node agents'
health (sorted by host)."""


def slow_gpus(
    store: Store, since: datetime, until: datetime, *, slow_frac: float, min_steps: int, min_peers: int
) -> SlowGpus:
    """The GPUs slower than their job peers by ``slow_frac`` or more in some job-day of
    ``[since, until)`` (:data:`_SLOW`), with the job-days each hosted (:data:`_JOB_DAYS`),
    and the job-days of all the other GPUs together: two queries, the fleet's rank-days
    grouped by numbers (names: :func:`gpu_names`, for the few GPUs reported). A job that runs
    over midnight is judged once per day: its peers are that day's."""
    p = {
        **_window(since, until),
        "slow_frac": float(slow_frac),
        "min_steps": int(min_steps),
        "min_peers": int(min_peers),
    }
    rows = sorted(store.query_rows(_SLOW, p))
    keys = np.array([int(r[0]) for r in rows], dtype=np.uint64)
    p["keys"] = ",".join(str(int(k)) for k in keys) or "0"
    jobs = np.zeros(len(keys), np.int64)
    others = others_jobs = 0
    idx = {int(k): i for i, k in enumerate(keys.tolist())}
    for k, n, distinct in store.query_rows(_JOB_DAYS, p):
        if int(k) == 0:
            others, others_jobs = int(distinct), int(n)
        else:
            jobs[idx[int(k)]] = int(n)
    slow = np.array([int(r[1]) for r in rows], dtype=np.int64)
    return SlowGpus(
        keys,
        np.maximum(jobs, slow),
        slow,
        np.array([float(r[2]) for r in rows]),
        np.array([float(r[3]) for r in rows]),
        others,
        others_jobs,
        np.array([str(r[4]) for r in rows], dtype=object),
        np.array([[int(r[5]), int(r[6])] for r in rows], dtype=np.uint64).reshape(len(rows), 2),
    )


def gpu_names(
    store: Store,
    since: datetime,
    until: datetime,
    slow: SlowGpus,
    which: Iterable[int],
    hosts: Iterable[str] = (),
) -> dict[int, tuple[str, str]]:
    """The host and GPU uuid of the GPUs ``which`` (indices into ``slow``), read by one of
    their job-days, and of the GPUs of ``hosts`` that their node agents reported in the
    window's days; keyed by GPU key."""
    out: dict[int, tuple[str, str]] = {}
    rows = sorted(set(which))
    if rows:
        p = {
            "rows": ",".join(f"{slow.days[i]}:{int(slow.at[i, 0])}:{int(slow.at[i, 1])}" for i in rows),
            "keys": ",".join(str(int(slow.keys[i])) for i in rows),
        }
        out.update({int(k): (str(h), str(g)) for k, h, g in store.query_rows(_SLOW_NAMES, p)})
    names = sorted(set(hosts))
    if names:
        p = {**_window(since, until), "hosts": _names(names)}
        out.update({int(k): (str(h), str(g)) for k, h, g in store.query_rows(_HOST_GPUS, p)})
    return out


def host_health(store: Store, since: datetime, until: datetime) -> HostHealth:
    """Every host's health samples and events per signal over the days ``[since, until]``
    touches (``gpu_health_daily``, grouped by host: one pass over the window's days)."""
    p = _window(since, until)
    rows = store.query_rows(
        f"""SELECT host, sum(samples), sum(throttled), sum(xid_samples), max(greatest(ecc_max, link_err_max))
            FROM gpu_health_daily WHERE {_DAYS} GROUP BY host ORDER BY host""",
        p,
    )
    # a counter's rise is max - min over the GPU's whole window (its rows of one day are not
    # merged yet while the day lasts, one sample each), read per GPU for the hosts whose
    # counters are not all 0 (by the sort key: those hosts' rows only)
    counting = [str(r[0]) for r in rows if int(r[4]) > 0]
    rises = (
        store.query_rows(
            f"""SELECT host, sum(ecc), sum(link) FROM (
                    SELECT host, gpu_uuid, max(ecc_max) - min(ecc_min) AS ecc,
                           max(link_err_max) - min(link_err_min) AS link
                    FROM gpu_health_daily WHERE {_MINE} AND {_DAYS} GROUP BY host, gpu_uuid)
                GROUP BY host""",
            {**p, "hosts": _names(counting)},
        )
        if counting
        else []
    )
    hosts = np.array([str(r[0]) for r in rows], dtype=object)
    samples = np.array([float(r[1]) for r in rows])
    events = np.zeros((len(rows), 4))
    events[:, :2] = np.array([[float(r[2]), float(r[3])] for r in rows]).reshape(len(rows), 2)
    if rises and len(hosts):
        idx = np.searchsorted(hosts, np.array([str(r[0]) for r in rises], dtype=object))
        ok = (idx < len(hosts)) & (
            hosts[np.minimum(idx, len(hosts) - 1)] == np.array([str(r[0]) for r in rises])
        )
        events[idx[ok], 2:] = np.array([[float(r[1]), float(r[2])] for r in rises])[ok]
    return HostHealth(hosts, samples, events)


def gpu_detail(
    store: Store,
    since: datetime,
    until: datetime,
    hosts: Sequence[str],
    *,
    causes: Iterable[str],
    kinds: Iterable[str],
) -> list[GpuDetail]:
    """Per GPU of a few hosts (those the health test flagged): its samples and events, and the
    distinct jobs that named it (sorted by host and GPU). Reads those hosts' rows only."""
    if not hosts:
        return []
    p = {**_window(since, until), "causes": _names(causes), "kinds": _names(kinds), "hosts": _names(hosts)}
    health = store.query_rows(
        f"""SELECT host, gpu_uuid, sum(samples), sum(throttled), sum(xid_samples),
                  max(ecc_max) - min(ecc_min), max(link_err_max) - min(link_err_min)
            FROM gpu_health_daily WHERE {_MINE} AND {_DAYS} GROUP BY host, gpu_uuid""",
        p,
    )
    jobs = {
        (str(h), str(g)): int(n)
        for h, g, n in store.query_rows(
            f"""SELECT host, g, uniqExact(job_hash) FROM node_jobs ARRAY JOIN gpus AS g
                WHERE {_MINE} AND {_IMPLICATING_HOURS} GROUP BY host, g""",
            p,
        )
    }
    out = [
        GpuDetail(str(h), str(g), int(n), (int(t), int(x), int(e), int(lk)), jobs.pop((str(h), str(g)), 0))
        for h, g, n, t, x, e, lk in health
    ]
    # a GPU named by jobs whose node agent sent nothing: no health, its jobs still count
    out += [GpuDetail(h, g, 0, (0, 0, 0, 0), n) for (h, g), n in jobs.items()]
    return sorted(out, key=lambda d: (d.host, d.gpu))


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
    """The evidence of a few hosts (the suspects): their jobs, anomalies, classes, GPUs,
    anomaly ids and health. Reads those hosts' rows only (the tables are sorted by host)."""
    if not hosts:
        return {}
    p = {**_window(since, until), "causes": _names(causes), "kinds": _names(kinds), "hosts": _names(hosts)}
    mine = _MINE
    rows = store.query_rows(
        f"""SELECT host, groupArray(a_cause), groupArray(a_lost), groupArray(id), groupArray(a_gpus),
                  groupArray(a_job)
            FROM (SELECT host, id, any(job) AS a_job, any(cause) AS a_cause,
                         argMax(gpu_hours_lost, end_step) AS a_lost, argMax(gpus, end_step) AS a_gpus
                  FROM anomaly_nodes WHERE {mine} AND {_IMPLICATING} GROUP BY host, id)
            GROUP BY host""",
        p,
    )
    health = {
        str(r[0]): r[1:]
        for r in store.query_rows(
            f"""SELECT host, sum(xs), sum(thr), sum(ecc), sum(link), groupUniqArrayArray(x) FROM (
                    SELECT host, gpu_uuid, sum(xid_samples) AS xs, sum(throttled) AS thr,
                           max(ecc_max) - min(ecc_min) AS ecc, max(link_err_max) - min(link_err_min) AS link,
                           groupUniqArrayArray(xids) AS x
                    FROM gpu_health_daily
                    WHERE {mine} AND {_DAYS}
                    GROUP BY host, gpu_uuid)
                GROUP BY host""",
            p,
        )
    }
    out: dict[str, HostEvidence] = {}
    for host, *columns in rows:
        items = list(zip(*columns, strict=True))  # (cause, lost, id, gpus, job) per anomaly
        by_cause: dict[str, int] = {}
        gpu_jobs: dict[str, set[str]] = {}
        for cause, _, _, gpus, job in items:
            by_cause[cause] = by_cause.get(cause, 0) + 1
            for g in gpus:
                gpu_jobs.setdefault(str(g), set()).add(job)
        xs, thr, ecc, link, xids = health.get(str(host), (0, 0, 0, 0, []))
        out[str(host)] = HostEvidence(
            str(host),
            tuple(sorted({str(i[4]) for i in items})),
            len(items),
            float(sum(i[1] for i in items)),
            dict(sorted(by_cause.items(), key=lambda kv: -kv[1])),
            {g: len(j) for g, j in sorted(gpu_jobs.items(), key=lambda kv: -len(kv[1]))},
            tuple(str(i[2]) for i in sorted(items, key=lambda i: -float(i[1]))[:max_ids]),
            tuple(sorted(int(x) for x in xids)),
            int(xs),
            int(thr),
            int(ecc),
            int(link),
        )
    return out


def lost_by_cause_day(
    store: Store, since: datetime, until: datetime, *, causes: Iterable[str] | None = None
) -> list[LostByDay]:
    """The fleet's GPU-hours lost per day and cause: every anomaly once, its latest version,
    dated by when it was detected; only ``causes`` when given. Versions are told apart by a
    64-bit hash of the id (a number groups faster than a string; a collision among a month's
    million ids has a chance of about 3e-8)."""
    p = _window(since, until)
    where = ""
    if causes is not None:
        p["causes"] = _names(causes)
        where = "AND cause IN splitByChar(',', {causes:String})"
    rows = store.query_rows(
        f"""SELECT a_day, a_cause, count(), sum(a_lost)
            FROM (SELECT cityHash64(id) AS a_id, toDate(min(time)) AS a_day, any(cause) AS a_cause,
                         argMax(gpu_hours_lost, end_step) AS a_lost
                  FROM anomalies
                  WHERE time >= {{since:DateTime64(3)}} AND time < {{until:DateTime64(3)}} {where}
                  GROUP BY a_id)
            GROUP BY a_day, a_cause ORDER BY a_day, a_cause""",
        p,
    )
    return [LostByDay(str(d), str(c), int(n), float(g)) for d, c, n, g in rows]


_SUSPECT_COLUMNS = {
    "host": pa.string(),
    "decided_by": pa.string(),
    "slower_than_peers": pa.string(),
    "confidence": pa.float64(),
    "rate_x_fleet_min": pa.float64(),
    "jobs": pa.uint32(),
    "jobs_expected": pa.float64(),
    "anomalies": pa.uint32(),
    "gpu_hours_hosted": pa.float64(),
    "gpu_hours_lost": pa.float64(),
    "causes": pa.map_(pa.string(), pa.uint32()),
    "gpus": pa.map_(pa.string(), pa.uint32()),
    "xid_samples": pa.uint64(),
    "ecc_errors": pa.uint64(),
    "throttled_samples": pa.uint64(),
    "link_errors": pa.uint64(),
    "anomaly_ids": pa.list_(pa.string()),
}
"""The columns of ``node_suspects`` a recording fills (besides ``time`` and ``since``)."""


def record_suspects(store: Store, at: datetime, since: datetime, suspects: Sequence[dict[str, Any]]) -> int:
    """Store the suspects of the window ``[since, at)`` (one dict per host, keyed by the
    columns of ``node_suspects``) as recorded at ``at``; returns how many were stored."""
    if not suspects:
        return 0
    missing = set(_SUSPECT_COLUMNS).difference(suspects[0])
    if missing:
        raise ValueError(f"a suspect lacks {sorted(missing)}")
    n = len(suspects)
    when = pa.array([_utc(at).replace(tzinfo=None)] * n, pa.timestamp("s"))
    start = pa.array([_utc(since).replace(tzinfo=None)] * n, pa.timestamp("s"))
    columns: dict[str, pa.Array] = {"time": when, "since": start}
    for name, kind in _SUSPECT_COLUMNS.items():
        values = [s[name] for s in suspects]
        if pa.types.is_map(kind):
            values = [list(v.items()) for v in values]
        columns[name] = pa.array(values, kind)
    store.insert_arrow("node_suspects", pa.table(columns))
    return n
