"""Dashboards, alert rules and datasource as Grafana provisioning files (generated, checked in).

Dashboards and alert rules are built with grafana-foundation-sdk, Grafana's own typed
builders; the ClickHouse query (no SDK builder exists for that plugin) is a small
``Dataquery`` of ours. ``export(folder)`` writes::

    folder/dashboards/argus-*.json                 dashboard JSON
    folder/provisioning/dashboards/argus.yaml      file provider for the JSON
    folder/provisioning/datasources/argus.yaml     the ClickHouse datasource (server, TLS, secrets from env)
    folder/provisioning/alerting/argus.yaml        unified alerting rules
    folder/provisioning/alerting/notifications.yaml  contact points, notification policies, mute timing

docker-compose and the Helm chart mount these files; ``argus grafana push`` sends the same
objects to a running Grafana (``api_alert_rules``: the HTTP API's field names).

Grafana's rules these files follow (tests/sinks/test_grafana_provisioning.py checks them,
citing Grafana's source): one default datasource per organization, so ours is never the
default; a rule names its dashboard with ``dashboardUid`` *and* ``panelId`` (the API:
annotations ``__dashboardUid__`` and ``__panelId__``, both or neither); the file says
``keepFiringFor``, the API ``keep_firing_for``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.builders import alerting as al
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import alerting as alm
from grafana_foundation_sdk.models import dashboard as dm

from .queries import ALERTS, DASHBOARDS, PIPELINE, AlertRule, Dashboard, Panel

__all__ = [
    "DATASOURCE_TYPE",
    "DATASOURCE_UID",
    "GrafanaOptions",
    "alert_rules",
    "api_alert_rules",
    "dashboard_json",
    "datasource",
    "export",
    "notifications",
    "pipeline_dashboard_json",
    "rendered_files",
]

DATASOURCE_UID = "argus-clickhouse"
DATASOURCE_TYPE = "grafana-clickhouse-datasource"
DS_VAR = "datasource"
PROM_VAR = "prometheus"
FOLDER = "Argus"
ALERT_DASHBOARD = "argus-job"
INTERVAL = "1m"  # the rule group's evaluation interval
ALERT_PANEL = "anomalies"  # the panel an alert links to (its id is the panel's position)
_DS = dm.DataSourceRef(type_val=DATASOURCE_TYPE, uid="${" + DS_VAR + "}")
_PROM = dm.DataSourceRef(type_val="prometheus", uid="${" + PROM_VAR + "}")
_FORMAT = {"timeseries": 0, "table": 1}  # the plugin's Format enum: 0 time series, 1 table


DOCS_URL = "https://github.com/argus-gpu/argus/blob/main/docs/on-call.md"
"""docs/on-call.md as people read it: every page's ``runbook_url`` is an anchor in it."""
INTEGRATIONS = ("webhook", "slack", "pagerduty", "email")
ONCALL = "argus-oncall"
PLATFORM = "argus-platform"
MAINTENANCE = "argus-maintenance"


@dataclass(frozen=True)
class GrafanaOptions:
    """Site settings baked into the exported files.

    ``base_url``: the Grafana people open (absolute: Slack and PagerDuty need absolute
    links); every alert's ``dashboard_url`` starts with it. ``docs_url``: where
    docs/on-call.md is read; every ``runbook_url`` is an anchor in it. Both are written into
    the files as they are: released Grafana (11.x, 12.x) does not expand variables in a
    provisioned rule's annotations. ``datasource_uid``: the ClickHouse datasource (the
    dashboards' variable defaults to it; the rules query it). ``integrations``: what the
    contact points send to (``webhook``, ``slack``, ``pagerduty``, ``email``; each reads its
    URL, key or address from Grafana's environment). ``team_routes``: ``(team, contact point)``
    pairs: pages of that team's jobs go to that contact point (which you provision).
    """

    datasource_uid: str = DATASOURCE_UID
    base_url: str = "http://localhost:3000"
    docs_url: str = DOCS_URL
    integrations: tuple[str, ...] = ("webhook",)
    team_routes: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for name, url in (("base_url", self.base_url), ("docs_url", self.docs_url)):
            if not url.startswith(("http://", "https://")) or "${" in url:
                raise ValueError(f"{name} must be an absolute http(s) URL, got {url!r}")
        unknown = set(self.integrations) - set(INTEGRATIONS)
        if unknown or not self.integrations:
            raise ValueError(
                f"integrations: one or more of {', '.join(INTEGRATIONS)} (got {self.integrations})"
            )


class _ClickHouseQuery(cogvariants.Dataquery):
    """A grafana-clickhouse-datasource query (v4 plugin model)."""

    def __init__(self, sql: str, fmt: int, datasource: dm.DataSourceRef | None) -> None:
        self.sql, self.fmt, self.datasource = sql, fmt, datasource

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "editorType": "sql",
            "format": self.fmt,
            "queryType": "timeseries" if self.fmt == 0 else "table",
            "rawSql": self.sql,
            "refId": "A",
        }
        if self.datasource is not None:
            out["datasource"] = self.datasource
        return out


class _ClickHouse(cogbuilder.Builder[cogvariants.Dataquery]):
    def __init__(self, sql: str, fmt: int, datasource: dm.DataSourceRef | None = _DS) -> None:
        self._query = _ClickHouseQuery(sql, fmt, datasource)

    def build(self) -> cogvariants.Dataquery:
        return self._query


def _as_dict(obj: Any) -> Any:
    return json.loads(json.dumps(obj, cls=JSONEncoder))


def _link(title: str, url: str) -> dict[str, Any]:
    return {"title": title, "url": url}


# Data links: job -> rank -> kernel (each keeps the time range).
_TO_JOB = (
    "/d/argus-job/argus-job-overview?var-job=${__value.raw}&${datasource:queryparam}&${__url_time_range}"
)
_TO_RANK = (
    "/d/argus-rank/argus-rank-drill-down?var-job=${job:percentencode}&var-rank=${__value.raw}"
    "&${datasource:queryparam}&${__url_time_range}"
)
_TO_KERNEL = (
    "/d/argus-kernel/argus-kernel?var-job=${job:percentencode}&var-rank=${rank:percentencode}"
    "&var-kernel=${__value.raw:percentencode}&${datasource:queryparam}&${__url_time_range}"
)
_LINKS = {
    ("slow_ranks", "rank"): _link("Rank drill-down", _TO_RANK),
    ("kernels", "name"): _link("Kernel across ranks", _TO_KERNEL),
    ("kernel_ranks", "rank"): _link("Rank drill-down", _TO_RANK),
    ("costliest", "job"): _link("Job overview", _TO_JOB),
    ("suspect_anomalies", "job"): _link("Job overview", _TO_JOB),
}


def _placed(panel: Panel, pid: int, x: int, y: int, datasource: dm.DataSourceRef) -> db.Panel:
    """The panel's id, kind, title, description, datasource and place, with no query yet."""
    return (
        db.Panel()
        .id(pid)
        .type(panel.kind)
        .title(panel.title)
        .description(panel.description)
        .datasource(datasource)
        .grid_pos(dm.GridPos(h=panel.height, w=panel.width, x=x, y=y))
        .options({})
    )


def _panel(panel: Panel, pid: int, x: int, y: int) -> db.Panel:
    fmt = _FORMAT["timeseries"] if panel.kind == "timeseries" else _FORMAT["table"]
    p = _placed(panel, pid, x, y, _DS).with_target(_ClickHouse(panel.sql, fmt))
    if panel.kind == "heatmap":
        p.options({"calculate": False, "yAxis": {"axisLabel": "rank"}, "color": {"scheme": "Oranges"}})
        p.with_transformation(
            dm.DataTransformerConfig(id_val="prepareTimeSeries", options={"format": "many"})
        )
    for (key, field), link in _LINKS.items():
        if key == panel.key:
            p.override_by_name(field, [dm.DynamicConfigValue(id_val="links", value=[link])])
    return p


_VARIABLE_SQL = {
    "job": "SELECT DISTINCT job FROM jobs ORDER BY job",
    "rank": "SELECT DISTINCT toString(rank) FROM steps WHERE job = decodeURLComponent('${job:percentencode}') "
    "AND $__timeFilter(time) ORDER BY toUInt32(rank)",
    "kernel": "SELECT DISTINCT name FROM kernels WHERE job = decodeURLComponent('${job:percentencode}') "
    "AND $__timeFilter(time) ORDER BY name",
}


def _variable(name: str) -> db.QueryVariable:
    query = _VARIABLE_SQL[name]
    return (
        db.QueryVariable(name)
        .label(name)
        .datasource(_DS)
        .query(query)
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(False)
        .multi(False)
        .sort(dm.VariableSort.DISABLED)
    )


def _datasource_variable(options: GrafanaOptions) -> db.DatasourceVariable:
    return (
        db.DatasourceVariable(DS_VAR)
        .label("ClickHouse")
        .type(DATASOURCE_TYPE)
        .current(dm.VariableOption(selected=True, text=options.datasource_uid, value=options.datasource_uid))
    )


def _layout(panels: tuple[Panel, ...]) -> list[tuple[Panel, int, int, int]]:
    out = []
    x = y = row_height = 0
    for pid, panel in enumerate(panels, start=1):
        if x + panel.width > 24:
            x, y, row_height = 0, y + row_height, 0
        out.append((panel, pid, x, y))
        x += panel.width
        row_height = max(row_height, panel.height)
    return out


def _dashboard_builder(dashboard: Dashboard, title_tags: list[str]) -> db.Dashboard:
    builder = (
        db.Dashboard(dashboard.title)
        .uid(dashboard.uid)
        .description(dashboard.description)
        .tags(title_tags)
        .timezone("utc")
        .editable()
        .refresh("30s")
        .time("now-1h", "now")
        .version(1)
    )
    for other in (*DASHBOARDS, PIPELINE):
        if other.uid != dashboard.uid:
            builder.link(
                db.DashboardLink(other.title)
                .type(dm.DashboardLinkType.LINK)
                .url(f"/d/{other.uid}")
                .keep_time(True)
                .include_vars(True)
            )
    return builder


def _dashboard_dict(builder: db.Dashboard) -> dict[str, Any]:
    out: dict[str, Any] = _as_dict(builder.build())
    out["schemaVersion"] = 39
    return out


def dashboard_json(dashboard: Dashboard, options: GrafanaOptions | None = None) -> dict[str, Any]:
    """Grafana dashboard JSON for one ClickHouse dashboard (datasource chosen by a variable)."""
    options = options or GrafanaOptions()
    builder = _dashboard_builder(dashboard, ["argus"])
    builder.with_variable(_datasource_variable(options))
    for name in dashboard.variables:
        builder.with_variable(_variable(name))
    for panel, pid, x, y in _layout(dashboard.panels):
        builder.with_panel(_panel(panel, pid, x, y))
    return _dashboard_dict(builder)


def pipeline_dashboard_json() -> dict[str, Any]:
    """ "Argus / Pipeline health": lag, throughput, dead letters, sink retries, relay drops (Prometheus)."""
    builder = _dashboard_builder(PIPELINE, ["argus", "argus-pipeline"])
    builder.with_variable(db.DatasourceVariable(PROM_VAR).label("Prometheus").type("prometheus"))
    for panel, pid, x, y in _layout(PIPELINE.panels):
        p = _placed(panel, pid, x, y, _PROM)
        for ref, line in zip("ABCDEFGH", panel.sql.split("\n"), strict=False):
            legend, _, expr = line.partition("=")
            p.with_target(prom.Dataquery().expr(expr.strip()).legend_format(legend.strip()).ref_id(ref))
        builder.with_panel(p)
    return _dashboard_dict(builder)


def _dashboard_url(rule: AlertRule, base: str) -> str:
    """The job's (or its suspect rank's) dashboard from 15 minutes before the anomaly to now."""
    base = base.rstrip("/")
    if rule.drilldown == "fleet":  # a node across jobs: the fleet dashboard over the model's window
        return f"{base}/d/argus-fleet/argus-fleet?from=now-7d&to=now"
    job = "var-job={{ urlquery $labels.job }}"
    when = "from={{ $labels.from_ms }}&to=now"
    overview = f"{base}/d/argus-job/argus-job-overview?{job}&{when}"
    if rule.drilldown == "rank":  # a rank suspect: its drill-down; a host or link: the job
        rank = f"{base}/d/argus-rank/argus-rank-drill-down?{job}&var-rank={{{{ $labels.rank }}}}&{when}"
        return f"{{{{ if $labels.rank }}}}{rank}{{{{ else }}}}{overview}{{{{ end }}}}"
    return overview


def _queries(rule: AlertRule, options: GrafanaOptions) -> list[cogbuilder.Builder[alm.Query]]:
    model = _ClickHouse(rule.sql, _FORMAT["table"], datasource=None)
    return [
        al.Query("A")
        .datasource_uid(options.datasource_uid)
        .relative_time_range(alm.RelativeTimeRange(from_val=rule.window_s, to=0))
        .model(model),
        al.Query("B")
        .datasource_uid("__expr__")
        .model(
            _Expression(
                {"type": "reduce", "expression": "A", "reducer": "last", "settings": {"mode": "dropNN"}}
            )
        ),
        al.Query("C")
        .datasource_uid("__expr__")
        .model(
            _Expression(
                {
                    "type": "threshold",
                    "expression": "B",
                    "conditions": [
                        {
                            "evaluator": {"type": "gt", "params": [rule.fire_above]},
                            "unloadEvaluator": {"type": "lt", "params": [rule.recover_below]},
                        }
                    ],
                }
            )
        ),
    ]


class _ExpressionQuery(cogvariants.Dataquery):
    def __init__(self, body: dict[str, object], ref: str) -> None:
        self.body, self.ref = body, ref

    def to_json(self) -> dict[str, object]:
        return {**self.body, "refId": self.ref}


class _Expression(cogbuilder.Builder[cogvariants.Dataquery]):
    """A server-side expression (reduce, threshold) as the alert's query model."""

    def __init__(self, body: dict[str, object]) -> None:
        self.body = body

    def build(self) -> cogvariants.Dataquery:
        return _ExpressionQuery(self.body, "")


def _sdk_rule(rule: AlertRule, options: GrafanaOptions, *, folder_uid: str, group: str) -> dict[str, Any]:
    """The rule as grafana-foundation-sdk builds it: the provisioning API's model."""
    builder = (
        al.Rule(rule.title)
        .uid(rule.uid)
        .condition("C")
        .queries(_queries(rule, options))
        .no_data_state("OK")
        .for_val(rule.pending)
        .annotations(
            {
                "summary": rule.summary,
                "description": rule.description,
                "runbook_url": f"{options.docs_url}#{rule.runbook}",
                "dashboard_url": _dashboard_url(rule, options.base_url),
            }
        )
        .labels({"severity": rule.severity, "source": "argus"})
        .is_paused(False)
        .folder_uid(folder_uid)
        .rule_group(group)
        .org_id(1)
    )
    out: dict[str, Any] = _as_dict(builder.build())
    # KeepLast (Grafana 11.1+; the SDK's enum predates it): a failed query (ClickHouse
    # unreachable) neither opens nor resolves a page; the pipeline's PrometheusRule reports it
    out["execErrState"] = "KeepLast"
    for q in out["data"]:  # the SDK leaves the expression's refId to us
        q["model"]["refId"] = q["refId"]
    return out


def _panel_id(dashboard_uid: str, key: str) -> int:
    dashboard = next(d for d in DASHBOARDS if d.uid == dashboard_uid)
    return next(pid for panel, pid, _, _ in _layout(dashboard.panels) if panel.key == key)


def _rule_panel(rule: AlertRule) -> tuple[str, int]:
    """The dashboard and panel a rule belongs to: the fleet's suspects for a fleet rule, else the
    job overview's anomalies."""
    uid, key = (
        ("argus-fleet", "suspect_nodes") if rule.drilldown == "fleet" else (ALERT_DASHBOARD, ALERT_PANEL)
    )
    return uid, _panel_id(uid, key)


def alert_rules(options: GrafanaOptions | None = None) -> dict[str, Any]:
    """Unified alerting provisioning document (file format v1) with every Argus rule."""
    options = options or GrafanaOptions()
    rules = []
    for rule in ALERTS:
        api = _sdk_rule(rule, options, folder_uid="argus", group="argus")
        rules.append(
            {
                "uid": api["uid"],
                "title": api["title"],
                "condition": api["condition"],
                "data": api["data"],
                # the file format's own fields (Grafana derives __dashboardUid__/__panelId__ from both)
                "dashboardUid": _rule_panel(rule)[0],
                "panelId": _rule_panel(rule)[1],
                "noDataState": api["noDataState"],
                "execErrState": api["execErrState"],
                "for": api["for"],
                "keepFiringFor": rule.keep_firing,
                "annotations": api["annotations"],
                "labels": api["labels"],
                "isPaused": api["isPaused"],
            }
        )
    return {
        "apiVersion": 1,
        "groups": [{"orgId": 1, "name": "argus", "folder": FOLDER, "interval": INTERVAL, "rules": rules}],
    }


def api_alert_rules(options: GrafanaOptions, *, folder_uid: str) -> list[dict[str, Any]]:
    """Bodies for ``POST/PUT /api/v1/provisioning/alert-rules`` (``keep_firing_for``, annotation pair)."""
    out = []
    for rule in ALERTS:
        body = _sdk_rule(rule, options, folder_uid=folder_uid, group="argus")
        body["keep_firing_for"] = rule.keep_firing
        uid, panel = _rule_panel(rule)
        body["annotations"]["__dashboardUid__"] = uid
        body["annotations"]["__panelId__"] = str(panel)
        out.append(body)
    return out


_INTEGRATION_SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    # type, settings; secrets and addresses from Grafana's environment ($VAR, or $__file{path}),
    # which file provisioning expands in contact points and policies (values.JSONValue)
    "webhook": ("webhook", {"url": "$ARGUS_ALERT_WEBHOOK_URL", "httpMethod": "POST"}),
    "slack": ("slack", {"url": "$ARGUS_SLACK_WEBHOOK_URL"}),
    "pagerduty": ("pagerduty", {"integrationKey": "$ARGUS_PAGERDUTY_KEY", "severity": "critical"}),
    "email": ("email", {"addresses": "$ARGUS_ALERT_EMAIL", "singleEmail": True}),
}
"""Each integration a contact point can have: Grafana's type and its settings."""

GROUP_BY = ["alertname", "job"]


def _contact_point(name: str, options: GrafanaOptions) -> dict[str, Any]:
    receivers = []
    for kind in options.integrations:
        typ, settings = _INTEGRATION_SETTINGS[kind]
        receivers.append({"uid": f"{name}-{kind}", "type": typ, "settings": dict(settings)})
    return {"orgId": 1, "name": name, "receivers": receivers}


def notifications(options: GrafanaOptions | None = None) -> dict[str, Any]:
    """Contact points, the notification policy tree and the maintenance mute timing (file v1).

    Routing: ``severity=page`` from Argus goes to ``argus-oncall`` (or the contact point of
    its ``team``, ``team_routes``), ``severity=ticket`` (fleet-level findings) and everything
    else to ``argus-platform``. Grouped by alert and job: one notification per job and rule,
    however many anomalies it holds; a page repeats hourly while it fires, a ticket daily.
    Both skip the ``argus-maintenance`` mute timing (declared maintenance windows: edit its
    time intervals; the shipped one lies in the year 2000, so it mutes nothing). This tree
    replaces the organization's notification policy tree when Grafana loads the file.
    """
    options = options or GrafanaOptions()
    team_routes = [
        {"receiver": receiver, "object_matchers": [["team", "=", team]]}
        for team, receiver in options.team_routes
    ]
    page: dict[str, Any] = {
        "receiver": ONCALL,
        "object_matchers": [["source", "=", "argus"], ["severity", "=", "page"]],
        "group_wait": "30s",
        "group_interval": "5m",
        "repeat_interval": "1h",
        "mute_time_intervals": [MAINTENANCE],
    }
    if team_routes:
        page["routes"] = team_routes
    ticket = {
        "receiver": PLATFORM,
        "object_matchers": [["severity", "=", "ticket"]],
        "group_wait": "5m",
        "group_interval": "30m",
        "repeat_interval": "24h",
        "mute_time_intervals": [MAINTENANCE],
    }
    return {
        "apiVersion": 1,
        "contactPoints": [_contact_point(ONCALL, options), _contact_point(PLATFORM, options)],
        "policies": [
            {
                "orgId": 1,
                "receiver": PLATFORM,
                "group_by": GROUP_BY,
                "group_wait": "30s",
                "group_interval": "5m",
                "repeat_interval": "4h",
                "routes": [page, ticket],
            }
        ],
        "muteTimes": [
            {
                "orgId": 1,
                "name": MAINTENANCE,
                "time_intervals": [{"years": ["2000"], "location": "UTC"}],
            }
        ],
    }


def datasource(options: GrafanaOptions | None = None) -> dict[str, Any]:
    """Datasource provisioning: server, protocol, TLS and credentials from Grafana's environment.

    Never the organization's default datasource (a kube-prometheus-stack Grafana already has
    one, and Grafana refuses two). HTTP(S) by default, the protocol the sink uses.
    """
    options = options or GrafanaOptions()
    return {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "Argus ClickHouse",
                "uid": options.datasource_uid,
                "type": DATASOURCE_TYPE,
                "access": "proxy",
                "isDefault": False,
                "editable": False,
                "jsonData": {
                    "host": "$ARGUS_CLICKHOUSE_HOST",
                    "port": "$ARGUS_CLICKHOUSE_PORT",
                    "protocol": "$ARGUS_CLICKHOUSE_PROTOCOL",
                    "secure": "$ARGUS_CLICKHOUSE_SECURE",
                    "tlsSkipVerify": False,
                    "defaultDatabase": "$ARGUS_CLICKHOUSE_DATABASE",
                    "username": "$ARGUS_CLICKHOUSE_USER",
                },
                "secureJsonData": {"password": "$ARGUS_CLICKHOUSE_PASSWORD"},
            }
        ],
    }


def _provider() -> dict[str, Any]:
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "argus",
                "folder": FOLDER,
                "type": "file",
                "allowUiUpdates": False,
                "options": {"path": "/var/lib/grafana/dashboards/argus"},
            }
        ],
    }


def rendered_files(options: GrafanaOptions | None = None) -> dict[str, str]:
    """Every provisioning file by relative path, as text."""
    options = options or GrafanaOptions()
    files = {
        f"dashboards/{d.uid}.json": json.dumps(dashboard_json(d, options), indent=2) + "\n"
        for d in DASHBOARDS
    }
    files[f"dashboards/{PIPELINE.uid}.json"] = json.dumps(pipeline_dashboard_json(), indent=2) + "\n"
    header = "# Generated by `argus grafana export`; edit sinks/grafana/, not this file.\n"
    for path, doc in (
        ("provisioning/dashboards/argus.yaml", _provider()),
        ("provisioning/datasources/argus.yaml", datasource(options)),
        ("provisioning/alerting/argus.yaml", alert_rules(options)),
        ("provisioning/alerting/notifications.yaml", notifications(options)),
    ):
        files[path] = header + yaml.safe_dump(doc, sort_keys=False, width=120)
    return files


def export(folder: str | Path, options: GrafanaOptions | None = None) -> list[Path]:
    """Write the provisioning files under ``folder``; return the paths written."""
    root = Path(folder)
    written = []
    for rel, text in rendered_files(options).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
