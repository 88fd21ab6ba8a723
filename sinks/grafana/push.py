"""Push dashboards and alert rules to a running Grafana with grafana-client."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from .provisioning import alert_rules, dashboard_json
from .queries import DASHBOARDS

__all__ = ["GrafanaPushError", "PushResult", "push"]

log = logging.getLogger("argus.grafana")
FOLDER_UID = "argus"


class GrafanaPushError(Exception):
    """Grafana refused or could not be reached; the message says which step failed."""


@dataclass
class PushResult:
    """What was created or updated."""

    dashboards: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)


def _api(url: str, token: str, timeout: float) -> Any:
    from grafana_client.api import GrafanaApi

    return GrafanaApi.from_url(url=url, credential=token, timeout=timeout)


def push(url: str, token: str, *, timeout: float = 10.0) -> PushResult:
    """Create or update the Argus folder, dashboards and alert rules in Grafana at ``url``."""
    from grafana_client.client import GrafanaClientError, GrafanaException

    api = _api(url, token, timeout)
    result = PushResult()
    step = "connect"
    try:
        step = "folder"
        try:
            api.folder.get_folder(FOLDER_UID)
        except GrafanaClientError:
            api.folder.create_folder("Argus", uid=FOLDER_UID)
        for dashboard in DASHBOARDS:
            step = f"dashboard {dashboard.uid}"
            api.dashboard.update_dashboard(
                {"dashboard": dashboard_json(dashboard), "folderUid": FOLDER_UID, "overwrite": True}
            )
            result.dashboards.append(dashboard.uid)
        for group in alert_rules()["groups"]:
            for rule in group["rules"]:
                step = f"alert rule {rule['uid']}"
                body = {**rule, "folderUID": FOLDER_UID, "ruleGroup": group["name"], "orgID": group["orgId"]}
                try:
                    api.alertingprovisioning.get_alertrule(rule["uid"])
                    api.alertingprovisioning.update_alertrule(rule["uid"], body)
                except GrafanaClientError:
                    api.alertingprovisioning.create_alertrule(body)
                result.rules.append(rule["uid"])
    except GrafanaException as exc:
        raise GrafanaPushError(f"Grafana at {url}: {step} failed: {exc}") from None
    except Exception as exc:  # connection errors come from the HTTP library underneath
        raise GrafanaPushError(f"Grafana at {url} unreachable during {step}: {type(exc).__name__}") from None
    return result
