"""What a dashboard, a panel and an alert rule are, and the SQL fragments they share
(variables percent-encoded inside ``decodeURLComponent('...')``: no value can break out of
its string literal)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EVIDENCE", "JOB", "KERNEL", "KERNEL_STATS", "RANK", "AlertRule", "Dashboard", "Panel", "each"]

JOB = "job = decodeURLComponent('${job:percentencode}')"
RANK = "rank = toUInt32OrZero(decodeURLComponent('${rank:percentencode}'))"
KERNEL = "name = decodeURLComponent('${kernel:percentencode}')"
EVIDENCE = (
    "arrayStringConcat(arrayMap((k, v) -> concat(k, '=', toString(round(v, 3))), mapKeys(evidence), "
    "mapValues(evidence)), ', ')"
)
"""An anomaly's evidence map as one line of ``key=value`` pairs."""
_LEGEND = {"p2p_ms": "send_recv"}


def each(template: str, columns: tuple[str, ...]) -> str:
    """``template`` for every column, ``{c}`` the column and ``{name}`` its name without ``_ms``."""
    return ", ".join(template.format(c=c, name=_LEGEND.get(c, c.removesuffix("_ms"))) for c in columns)


KERNEL_STATS = """sum(count) AS calls, round(sum(total_ns) / 1e6, 2) AS total_ms,
       round(quantile(0.5)(p50_ns) / 1e3, 2) AS p50_us, round(quantile(0.5)(p99_ns) / 1e3, 2) AS p99_us,
       round(max(max_ns) / 1e3, 2) AS max_us"""
"""A kernel's calls, total and typical durations over the rows selected (the median step's p50/p99)."""


@dataclass(frozen=True)
class Panel:
    """One panel: its SQL, how Grafana draws it, and where."""

    key: str
    title: str
    kind: str  # timeseries | table | heatmap | flamegraph | stat | barchart
    sql: str
    description: str = ""
    width: int = 12
    height: int = 8


@dataclass(frozen=True)
class Dashboard:
    """A dashboard: uid, title, variables it needs and its panels in reading order."""

    uid: str
    title: str
    variables: tuple[str, ...]
    panels: tuple[Panel, ...]
    description: str = ""


@dataclass(frozen=True)
class AlertRule:
    """A unified-alerting rule: SQL returning one row per alert instance, its string columns
    the instance's labels (its identity: fixed for the life of what it reports) and one
    numeric column, ``value``, compared with ``fire_above`` (``recover_below`` while it fires).

    ``window_s`` is the query's ``relativeTimeRange`` (how far back ``$__timeFilter`` looks);
    ``pending`` Grafana's ``for``, ``keep_firing`` its ``keepFiringFor``; ``runbook`` the
    anchor of docs/on-call.md the page links to (may use ``{{ $labels.x }}``).

    Labels come only from what every version of an anomaly shares (id, job, cause, suspect,
    onset; a straggler's ``time``, its confirmation): the store keeps just the latest version
    of an id after a merge (ReplacingMergeTree on ``job, id``), and a label that changes is a
    new alert instance, a second page.
    """

    uid: str
    title: str
    sql: str
    value: str  # the numeric column
    fire_above: float
    recover_below: float
    pending: str  # Grafana duration the condition must hold before firing
    keep_firing: str  # hysteresis: how long it keeps firing once the condition clears
    summary: str
    description: str
    severity: str = "page"
    drilldown: str = "job"  # dashboard link: "job" overview, "rank" drill-down (needs a rank label), "fleet"
    window_s: int = 600
    runbook: str = ""
