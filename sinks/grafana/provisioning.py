"""Dashboards, alert rules and datasource as Grafana provisioning files (generated, checked in).

``export(folder)`` writes::

    folder/dashboards/argus-*.json                 dashboard JSON
    folder/provisioning/dashboards/argus.yaml      file provider for the JSON
    folder/provisioning/datasources/argus.yaml     the ClickHouse datasource (secrets from env)
    folder/provisioning/alerting/argus.yaml        unified alerting rules

docker-compose and the Helm chart mount these files; ``argus grafana push`` sends the same
objects to a running Grafana.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from .queries import ALERTS, DASHBOARDS, AlertRule, Dashboard, Panel

__all__ = [
    "DATASOURCE_UID",
    "alert_rules",
    "dashboard_json",
    "datasource",
    "export",
    "rendered_files",
]

DATASOURCE_UID = "argus-clickhouse"
DATASOURCE_TYPE = "grafana-clickhouse-datasource"
_DS = {"type": DATASOURCE_TYPE, "uid": DATASOURCE_UID}
_FORMAT = {"timeseries": 0, "table": 1}  # the plugin's Format enum: 0 time series, 1 table


def _target(panel: Panel) -> dict[str, Any]:
    fmt = _FORMAT["timeseries"] if panel.kind == "timeseries" else _FORMAT["table"]
    return {
        "datasource": _DS,
        "editorType": "sql",
        "format": fmt,
        "queryType": "timeseries" if fmt == 0 else "table",
        "rawSql": panel.sql,
        "refId": "A",
    }


def _panel(panel: Panel, pid: int, x: int, y: int, dashboard: Dashboard) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": _DS,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "targets": [_target(panel)],
        "options": {},
        "fieldConfig": {"defaults": {}, "overrides": []},
    }
    if panel.kind == "heatmap":
        out["options"] = {"calculate": False, "yAxis": {"axisLabel": "rank"}, "color": {"scheme": "Oranges"}}
        out["transformations"] = [{"id": "prepareTimeSeries", "options": {"format": "many"}}]
    if panel.key == "slow_ranks":  # click a rank to drill down
        out["fieldConfig"]["overrides"] = [
            {
                "matcher": {"id": "byName", "options": "rank"},
                "properties": [
                    {
                        "id": "links",
                        "value": [
                            {
                                "title": "Rank drill-down",
                                "url": "/d/argus-rank/argus-rank-drill-down?var-job=${job:percentencode}"
                                "&var-rank=${__value.raw}&${__url_time_range}",
                            }
                        ],
                    }
                ],
            }
        ]
    return out


def _variable(name: str) -> dict[str, Any]:
    query = {
        "job": "SELECT DISTINCT job FROM jobs ORDER BY job",
        "rank": "SELECT DISTINCT toString(rank) FROM steps WHERE job = decodeURLComponent('${job:percentencode}') "
        "AND $__timeFilter(time) ORDER BY toUInt32(rank)",
    }[name]
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": _DS,
        "query": query,
        "definition": query,
        "refresh": 2,
        "includeAll": False,
        "multi": False,
        "sort": 0,
    }


def dashboard_json(dashboard: Dashboard) -> dict[str, Any]:
    """Grafana dashboard JSON (schemaVersion 39) for one dashboard."""
    panels = []
    x = y = row_height = 0
    for pid, panel in enumerate(dashboard.panels, start=1):
        if x + panel.width > 24:
            x, y, row_height = 0, y + row_height, 0
        panels.append(_panel(panel, pid, x, y, dashboard))
        x += panel.width
        row_height = max(row_height, panel.height)
    links = [
        {"title": d.title, "type": "link", "url": f"/d/{d.uid}", "keepTime": True, "includeVars": True}
        for d in DASHBOARDS
        if d.uid != dashboard.uid
    ]
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["argus"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "links": links,
        "templating": {"list": [_variable(v) for v in dashboard.variables]},
        "panels": panels,
    }


def _rule(rule: AlertRule) -> dict[str, Any]:
    return {
        "uid": rule.uid,
        "title": rule.title,
        "condition": "C",
        "data": [
            {
                "refId": "A",
                "relativeTimeRange": {"from": 600, "to": 0},
                "datasourceUid": DATASOURCE_UID,
                "model": {
                    "editorType": "sql",
                    "format": 1,
                    "queryType": "table",
                    "rawSql": rule.sql,
                    "refId": "A",
                },
            },
            {
                "refId": "B",
                "datasourceUid": "__expr__",
                "model": {
                    "type": "reduce",
                    "expression": "A",
                    "reducer": "last",
                    "refId": "B",
                    "settings": {"mode": "dropNN"},
                },
            },
            {
                "refId": "C",
                "datasourceUid": "__expr__",
                "model": {
                    "type": "threshold",
                    "expression": "B",
                    "refId": "C",
                    "conditions": [
                        {
                            "evaluator": {"type": "gt", "params": [rule.fire_above]},
                            "unloadEvaluator": {"type": "lt", "params": [rule.recover_below]},
                        }
                    ],
                },
            },
        ],
        "noDataState": "OK",
        "execErrState": "Error",
        "for": rule.pending,
        "keepFiringFor": rule.keep_firing,
        "annotations": {
            "summary": rule.summary,
            "description": rule.description,
            "__dashboardUid__": "argus-job",
            "runbook_url": "/d/argus-rank/argus-rank-drill-down?var-job={{ $labels.job }}&var-rank={{ $labels.rank }}",
        },
        "labels": {"severity": rule.severity, "source": "argus"},
        "isPaused": False,
    }


def alert_rules() -> dict[str, Any]:
    """Unified alerting provisioning document with every Argus rule."""
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": 1,
                "name": "argus",
                "folder": "Argus",
                "interval": "30s",
                "rules": [_rule(r) for r in ALERTS],
            }
        ],
    }


def datasource() -> dict[str, Any]:
    """Datasource provisioning: the server and credentials come from Grafana's environment."""
    return {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "Argus ClickHouse",
                "uid": DATASOURCE_UID,
                "type": DATASOURCE_TYPE,
                "isDefault": True,
                "jsonData": {
                    "host": "$ARGUS_CLICKHOUSE_HOST",
                    "port": 9000,
                    "protocol": "native",
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
                "folder": "Argus",
                "type": "file",
                "allowUiUpdates": False,
                "options": {"path": "/var/lib/grafana/dashboards/argus"},
            }
        ],
    }


def rendered_files() -> dict[str, str]:
    """Every provisioning file by relative path, as text."""
    files = {f"dashboards/{d.uid}.json": json.dumps(dashboard_json(d), indent=2) + "\n" for d in DASHBOARDS}
    header = "# Generated by `argus grafana export`; edit sinks/grafana/, not this file.\n"
    for path, doc in (
        ("provisioning/dashboards/argus.yaml", _provider()),
        ("provisioning/datasources/argus.yaml", datasource()),
        ("provisioning/alerting/argus.yaml", alert_rules()),
    ):
        files[path] = header + yaml.safe_dump(doc, sort_keys=False, width=120)
    return files


def export(folder: str | Path) -> list[Path]:
    """Write the provisioning files under ``folder``; return the paths written."""
    root = Path(folder)
    written = []
    for rel, text in rendered_files().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
