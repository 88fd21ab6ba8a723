"""Grafana as code: panel and alert SQL, provisioning files, push to a running Grafana."""

from __future__ import annotations

from .macros import MacroError, expand, percent_encode
from .provisioning import alert_rules, dashboard_json, datasource, export, rendered_files
from .push import GrafanaPushError, PushResult, push
from .queries import ALERTS, DASHBOARDS, AlertRule, Dashboard, Panel, all_panels

__all__ = [
    "ALERTS",
    "DASHBOARDS",
    "AlertRule",
    "Dashboard",
    "GrafanaPushError",
    "MacroError",
    "Panel",
    "PushResult",
    "alert_rules",
    "all_panels",
    "dashboard_json",
    "datasource",
    "expand",
    "export",
    "percent_encode",
    "push",
    "rendered_files",
]
