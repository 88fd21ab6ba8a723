"""The SQL of every dashboard panel and alert rule, as data.

One set of queries serves Grafana (through the ClickHouse datasource plugin's macros),
the tests (which expand the macros and run them on chDB) and ``argus report``. Variables
are always percent-encoded inside ``decodeURLComponent('...')`` so that no value can
break out of its string literal.

The dashboards are in :mod:`.dashboards`, the alert rules in :mod:`.alerts`, their types
and shared fragments in :mod:`._panels`; this module gathers them and holds the queries only
``argus report`` needs.
"""

from __future__ import annotations

from argus.schemas import PHASE_COLUMNS

from .._sql import BUSY_MS as BUSY
from ._panels import JOB, RANK, AlertRule, Dashboard, Panel, each
from .alerts import ACTIVE_S, ALERTS, RESENT_S, SCAN_S, TEAM
from .dashboards import DASHBOARDS, FLEET, PIPELINE

__all__ = [
    "ACTIVE_S",
    "ALERTS",
    "DASHBOARDS",
    "FLEET",
    "PIPELINE",
    "REPORT",
    "RESENT_S",
    "SCAN_S",
    "TEAM",
    "AlertRule",
    "Dashboard",
    "Panel",
    "all_panels",
]


def all_panels() -> list[tuple[Dashboard, Panel]]:
    """Every panel with its dashboard (for tests, export and the report)."""
    return [(d, p) for d in DASHBOARDS for p in d.panels]


# -- argus report ------------------------------------------------------------------------
# Queries only the report needs (it reuses the panels above for everything else). Same
# macros and variables as the panels, so the same expander runs them.

REPORT = (
    Panel(
        "flagged_steps",
        "Steps each rank was flagged in (sightings)",
        "table",
        f"""SELECT rank, count() AS flagged, groupArray(4096)(step) AS steps
FROM (SELECT step, arrayJoin(suspects) AS rank FROM step_summaries WHERE {JOB} AND $__timeFilter(time))
GROUP BY rank ORDER BY flagged DESC, rank LIMIT 200""",
        "The report subtracts the steps inside the rank's anomalies: what is left are transients.",
    ),
    Panel(
        "anomaly_windows",
        "Anomaly windows and ranks",
        "table",
        f"""SELECT id, argMax(anomalies.ranks, end_step) AS ranks, min(start_step) AS first, max(end_step) AS last
FROM anomalies WHERE {JOB} AND $__timeFilter(time) GROUP BY id LIMIT 10000""",
    ),
    Panel(
        "busy_by_step",
        "Busy time per rank and step (ms)",
        "heatmap",
        f"""WITH (SELECT max(rank) FROM steps WHERE {JOB} AND $__timeFilter(time)) AS max_rank,
     (SELECT min(first_step) FROM jobs WHERE {JOB}) AS first,
     (SELECT max(last_step) FROM jobs WHERE {JOB}) AS last
SELECT first + intDiv(step - first, intDiv(last - first, 240) + 1) * (intDiv(last - first, 240) + 1) AS step_group,
       intDiv(rank, intDiv(max_rank, 256) + 1) * (intDiv(max_rank, 256) + 1) AS rank_group,
       max({BUSY}) AS busy_ms
FROM steps WHERE {JOB} AND $__timeFilter(time)
GROUP BY step_group, rank_group ORDER BY step_group, rank_group""",
        "At most 240 step columns and 256 rank rows; a cell is the busiest rank-step in it.",
    ),
    Panel(
        "phases_by_rank",
        "Phases per rank (mean ms per step)",
        "table",
        f"""SELECT rank, any(host) AS rank_host, sum(steps) AS n, sum(step_sum) / n AS step,
       {each("sum({name}_sum) / n AS {name}", PHASE_COLUMNS)},
       sum(collective_sum) / n AS collective, sum(busy_sum) / n AS busy
FROM steps_rank_minutely WHERE {JOB} AND $__timeFilter(minute)
GROUP BY rank ORDER BY rank""",
    ),
    Panel(
        "suspect_ranks",
        "Suspect ranks by cost",
        "table",
        f"""SELECT arrayJoin(anomalies.ranks) AS rank, max(anomalies.gpu_hours_lost) AS lost,
       argMax(anomalies.cause, anomalies.gpu_hours_lost) AS top_cause
FROM anomalies WHERE {JOB} AND $__timeFilter(time)
GROUP BY rank ORDER BY lost DESC, rank LIMIT 3""",
    ),
    Panel(
        "kernel_shift",
        "Kernels: this rank vs its peers (µs)",
        "table",
        f"""WITH per_rank AS (
    SELECT name, rank, sum(total_ns) AS total_ns, sum(count) AS calls,
           quantile(0.5)(p50_ns) AS p50, quantile(0.5)(p99_ns) AS p99
    FROM kernels WHERE {JOB} AND $__timeFilter(time) GROUP BY name, rank)
SELECT name, sumIf(total_ns, {RANK}) / 1e6 AS total_ms, sumIf(calls, {RANK}) AS calls,
       anyIf(p50, {RANK}) / 1e3 AS p50_us, anyIf(p99, {RANK}) / 1e3 AS p99_us,
       medianIf(p50, NOT {RANK}) / 1e3 AS peers_p50_us, medianIf(p99, NOT {RANK}) / 1e3 AS peers_p99_us,
       countIf(NOT {RANK}) AS peers
FROM per_rank GROUP BY name HAVING total_ms > 0 ORDER BY total_ms DESC LIMIT 15""",
        "Median over steps of each rank's per-step p50/p99; peers are every other rank with kernel data.",
    ),
)
"""Report-only queries (not on a dashboard): the steps axis, per-rank phases, suspects, kernel shifts."""
