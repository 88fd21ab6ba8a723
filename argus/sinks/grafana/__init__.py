"""Grafana as code: panel and alert SQL, provisioning files, push to a running Grafana."""

from __future__ import annotations

from .macros import MacroError, expand, percent_encode
from .provisioning import (
    GrafanaOptions,
    alert_rules,
    api_alert_rules,
    dashboard_json,
    datasource,
    export,
    notifications,
    pipeline_dashboard_json,
    rendered_files,
)
from .push import GrafanaPushError, PushResult, push
from .queries import ALERTS, DASHBOARDS, PIPELINE, AlertRule, Dashboard, Panel, all_panels

__all__ = [
    "ALERTS",
    "DASHBOARDS",
    "PIPELINE",
    "AlertRule",
    "Dashboard",
    "GrafanaOptions",
    "GrafanaPushError",
    "MacroError",
    "Panel",
    "PushResult",
    "alert_rules",
    "all_panels",
    "api_alert_rules",
    "dashboard_json",
    "datasource",
    "expand",
    "export",
    "notifications",
    "percent_encode",
    "pipeline_dashboard_json",
    "push",
    "rendered_files",
]
