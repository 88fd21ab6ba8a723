"""What the report shows, read from the store with the dashboards' own SQL.

Every query is a Grafana panel (``sinks.grafana.queries``) expanded with the plugin's
macros for the job's time range, so the report and the dashboards cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from .._errors import SinkError
from ..grafana import all_panels, expand
from ..grafana.queries import REPORT
from ..store import Store

__all__ = ["ReportData", "Suspect", "Table", "UnknownJobError", "collect"]

_SQL = {p.key: p.sql for _, p in all_panels()} | {p.key: p.sql for p in REPORT}
MAX_SUSPECTS = 3


class UnknownJobError(SinkError, LookupError):
    """The store has no steps of the job; ``known`` lists the most recent jobs it has."""

    def __init__(self, job: str, known: Sequence[str]) -> None:
        self.job = job
        self.known = tuple(known)
        listing = ", ".join(repr(k) for k in self.known) if self.known else "none: the store has no steps yet"
        super().__init__(f"no job {job!r} in the store; known jobs: {listing}")


@dataclass(frozen=True)
class Table:
    """A query result: column names and rows."""

    names: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def column(self, name: str) -> list[Any]:
        """One column's values (empty when the query returned no rows)."""
        if name not in self.names:
            return []
        i = self.names.index(name)
        return [r[i] for r in self.rows]

    def dicts(self) -> list[dict[str, Any]]:
        """The rows as dicts keyed by column name."""
        return [dict(zip(self.names, r, strict=True)) for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class Suspect:
    """A rank the report drills into: why it was picked, its kernels and its call stacks."""

    rank: int
    reason: str  # the anomaly's root cause, or "slowest rank" without an anomaly
    gpu_hours_lost: float
    kernels: Table  # kernel_shift rows
    stacks: Table  # the flame graph panel's nested-set rows


@dataclass(frozen=True)
class ReportData:
    """Everything one report shows, for one job."""

    job: str
    start: datetime
    end: datetime
    generated: datetime
    summary: dict[str, Any]
    step_time: Table
    heatmap: Table
    slow_ranks: Table
    phases: Table
    anomalies: Table
    suspects: tuple[Suspect, ...]
    transients: tuple[tuple[int, int], ...] = ()
    """(rank, one-step sightings outside every anomaly of the rank), most first."""
    steps_span: tuple[datetime, datetime] | None = None
    """When the job's first step began and its last one ended (``start``/``end`` add the
    margin for rows stamped on arrival)."""


def _known_jobs(store: Store, limit: int = 10) -> list[str]:
    rows = store.query_rows(
        "SELECT job FROM jobs GROUP BY job ORDER BY max(last_time) DESC, job LIMIT {n:UInt32}", {"n": limit}
    )
    return [str(r[0]) for r in rows]


def _job_range(store: Store, job: str) -> tuple[datetime, datetime] | None:
    rows = store.query_rows(
        "SELECT count(), min(first_time), max(last_time) FROM jobs WHERE job = {job:String}", {"job": job}
    )
    if not rows or not rows[0][0]:
        return None
    first, last = rows[0][1], rows[0][2]
    return _utc(first), _utc(last)


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


@dataclass(frozen=True)
class _Runner:
    """Runs panels by key for one job, time range and interval."""

    store: Store
    job: str
    start: datetime
    end: datetime
    interval_s: int

    def __call__(self, key: str, **variables: str) -> Table:
        sql = expand(
            _SQL[key],
            start=self.start,
            end=self.end,
            interval_s=self.interval_s,
            variables={"job": self.job, **variables},
        )
        result = self.store.query_arrow(sql)
        names = tuple(result.column_names)
        rows = tuple(zip(*(c.to_pylist() for c in result.columns), strict=True)) if names else ()
        return Table(names, rows)


def _pick_suspects(suspects: Table, slow_ranks: Table) -> list[tuple[int, str, float]]:
    picked = [(int(r["rank"]), str(r["top_cause"]), float(r["lost"])) for r in suspects.dicts()]
    if not picked and len(slow_ranks):
        top = slow_ranks.dicts()[0]
        picked = [(int(top["rank"]), f"slowest rank (busy-time z = {top['z']:.1f}), no anomaly", 0.0)]
    return picked[:MAX_SUSPECTS]


def _next_second(t: datetime) -> datetime:
    """``t`` rounded up to a whole second."""
    whole = t.replace(microsecond=0)
    return whole if whole == t else whole + timedelta(seconds=1)


def collect(
    store: Store, job: str, *, now: datetime | None = None, margin: timedelta | None = None
) -> ReportData:
    """Read a job's report data from the store.

    Args:
        store: a migrated store.
        job: the job id, any string (it reaches SQL only percent-encoded or bound).
        now: the report's clock (default: the current time); the time range ends at
            ``max(now, last step)`` so that rows stamped on arrival (kernels, anomalies)
            are inside it.
        margin: slack before the job's first step (default one minute).

    Raises:
        UnknownJobError: the store has no steps of ``job``.
    """
    span = _job_range(store, job)
    if span is None:
        raise UnknownJobError(job, _known_jobs(store))
    margin = timedelta(minutes=1) if margin is None else margin
    # to the whole second, as the queries' time filter reads its bounds
    generated = _next_second((now or datetime.now(UTC)).astimezone(UTC))
    start = span[0] - margin
    end = _next_second(max(span[1], generated))  # rows are stamped on arrival, none after the report
    step_span = max((span[1] - span[0]).total_seconds(), 1.0)
    run = _Runner(store, job, start, end, max(1, int(step_span // 120) + 1))
    summary_rows = run("job_summary").dicts()
    slow_ranks = run("slow_ranks")
    chosen = _pick_suspects(run("suspect_ranks"), slow_ranks)
    suspects = tuple(
        Suspect(
            rank,
            reason,
            cost,
            kernels=run("kernel_shift", rank=str(rank)),
            stacks=run("stacks", rank=str(rank)),
        )
        for rank, reason, cost in chosen
    )
    return ReportData(
        job=job,
        start=start,
        end=end,
        generated=generated,
        summary=summary_rows[0] if summary_rows else {},
        # step time over the job's own span, not the slack for rows stamped on arrival
        step_time=replace(run, start=span[0] - timedelta(seconds=1), end=span[1] + timedelta(seconds=1))(
            "step_time"
        ),
        heatmap=run("busy_by_step"),
        slow_ranks=slow_ranks,
        phases=run("phases_by_rank"),
        anomalies=run("anomalies"),
        suspects=suspects,
        transients=transients(run("flagged_steps"), run("anomaly_windows")),
        steps_span=span,
    )


def transients(flagged: Table, windows: Table) -> tuple[tuple[int, int], ...]:
    """Per rank, the steps it was flagged in that no anomaly of it covers (blips)."""
    covered: dict[int, list[tuple[int, int]]] = {}
    for w in windows.dicts():
        for r in w["ranks"]:
            covered.setdefault(int(r), []).append((int(w["first"]), int(w["last"])))
    out = []
    for row in flagged.dicts():
        rank = int(row["rank"])
        spans = covered.get(rank, [])
        n = sum(1 for st in row["steps"] if not any(a <= st <= b for a, b in spans))
        if n:
            out.append((rank, n))
    return tuple(sorted(out, key=lambda x: (-x[1], x[0])))
