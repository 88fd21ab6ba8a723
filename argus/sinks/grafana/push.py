"""Push dashboards and alert rules to a running Grafana with grafana-client."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from .._errors import GrafanaPushError
from .provisioning import GrafanaOptions, api_alert_rules, dashboard_json, pipeline_dashboard_json
from .queries import DASHBOARDS

__all__ = ["FOLDER_UID", "GrafanaPushError", "PushResult", "push"]

log = logging.getLogger("argus.grafana")
FOLDER_UID = "argus"


@dataclass
class PushResult:
    """What was created or updated."""

    dashboards: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)


def _api(url: str, token: str, timeout: float) -> Any:
    from grafana_client.api import GrafanaApi

    return GrafanaApi.from_url(url=url, credential=token, timeout=timeout)


def push(url: str, token: str, *, timeout: float = 10.0, options: GrafanaOptions | None = None) -> PushResult:
    """Create or update the Argus folder, dashboards and alert rules in Grafana at ``url``.

    Alert rules go through the alerting provisioning API, whose duration key is
    ``keep_firing_for`` and whose dashboard link is the annotation pair
    ``__dashboardUid__``/``__panelId__``. Dashboard links default to ``url`` itself.
    """
    from grafana_client.client import GrafanaClientError, GrafanaException

    options = options or GrafanaOptions(base_url=url)
    api = _api(url, token, timeout)
    result = PushResult()
    step = "connect"
    try:
        step = "folder"
        try:
            api.folder.get_folder(FOLDER_UID)
        except GrafanaClientError:
            api.folder.create_folder("Argus", uid=FOLDER_UID)
        docs = [dashboard_json(d, options) for d in DASHBOARDS] + [pipeline_dashboard_json()]
        for doc in docs:
            step = f"dashboard {doc['uid']}"
            api.dashboard.update_dashboard({"dashboard": doc, "folderUid": FOLDER_UID, "overwrite": True})
            result.dashboards.append(doc["uid"])
        for body in api_alert_rules(options, folder_uid=FOLDER_UID):
            uid = body["uid"]
            step = f"alert rule {uid}"
            try:
                api.alertingprovisioning.get_alertrule(uid)
            except GrafanaClientError:
                api.alertingprovisioning.create_alertrule(body)
            else:
                api.alertingprovisioning.update_alertrule(uid, body)
            result.rules.append(uid)
    except GrafanaException as exc:
        raise GrafanaPushError(f"Grafana at {url}: {step} failed: {exc}") from None
    except Exception as exc:  # connection errors come from the HTTP library underneath
        raise GrafanaPushError(f"Grafana at {url} unreachable during {step}: {type(exc).__name__}") from None
    return result
