"""The Grafana files and API bodies against the rules Grafana enforces when it loads them.

No Grafana server can run here (no container runtime; Grafana is not on PyPI), so each rule
below is the check Grafana's own code makes, cited by file (and line, at the commit named)
in github.com/grafana/grafana unless said otherwise. A file that breaks one of them stops
Grafana's provisioning at startup (alerting) or is refused (dashboards, datasources).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from argus.sinks.grafana import ALERTS, DASHBOARDS, PIPELINE, GrafanaOptions, api_alert_rules, notifications
from argus.sinks.grafana.provisioning import DATASOURCE_TYPE, DOCS_URL

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "grafana"
CHART = REPO / "helm" / "argus" / "files" / "grafana"

RULES_TYPES = "pkg/services/provisioning/alerting/rules_types.go@0085cf8671"
ALERT_RULE_GO = "pkg/services/ngalert/models/alert_rule.go"
DS_READER = "pkg/services/provisioning/datasources/config_reader.go@07b920c55a"
CH_SETTINGS = "grafana/clickhouse-datasource pkg/plugin/settings.go@030e8e675a"

# AlertRuleV1's yaml tags (rules_types.go L61-77): yaml.Unmarshal drops any other key without a
# word, so a misspelt key (keep_firing_for in a file) is a setting silently lost.
RULE_FILE_KEYS = {
    "uid", "title", "condition", "data", "dasboardUid", "dashboardUid", "panelId", "noDataState",
    "execErrState", "for", "keepFiringFor", "missing_series_evals_to_resolve", "annotations", "labels",
    "isPaused", "notification_settings", "record",
}  # fmt: skip
QUERY_FILE_KEYS = {"refId", "queryType", "relativeTimeRange", "datasourceUid", "model"}  # QueryV1
# models.ErrStateFromString / NoDataStateFromString (pkg/services/ngalert/models/alert_rule.go)
EXEC_ERR_STATES = {"Alerting", "Error", "OK", "KeepLast"}
NO_DATA_STATES = {"Alerting", "NoData", "OK", "KeepLast"}
_DURATION = re.compile(
    r"^(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$"
)
# pkg/util/shortid_generator.go: IsValidShortUID ^[a-zA-Z0-9\-\_]*$, IsShortUIDTooLong > 40
_UID = re.compile(r"^[a-zA-Z0-9\-_]{1,40}$")


def prometheus_duration(value: str) -> bool:
    """github.com/prometheus/common/model.ParseDuration, which every duration above goes through."""
    return value == "0" or (value != "" and _DURATION.match(value) is not None)


def check_annotation_pair(annotations: dict[str, str]) -> list[str]:
    """alert_rule.go, AlertRule.SetDashboardAndPanelFromAnnotations: "both annotations
    __dashboardUid__ and __panelId__ must be specified", and __panelId__ "must be a valid integer"."""
    dash, panel = annotations.get("__dashboardUid__", ""), annotations.get("__panelId__", "")
    if bool(dash) != bool(panel):
        return ["both annotations __dashboardUid__ and __panelId__ must be specified"]
    if panel and not re.fullmatch(r"-?\d+", panel):
        return ["annotation __panelId__ must be a valid integer Panel ID"]
    return []


def check_rule_file(doc: dict[str, Any], dashboards: dict[str, dict[str, Any]]) -> list[str]:
    """Every check Grafana's file provisioning makes on an alert rules file (v1)."""
    errors: list[str] = []
    if doc.get("apiVersion") != 1:
        errors.append("apiVersion 1 expected")
    for group in doc["groups"]:
        if not str(group.get("name", "")).strip():  # rules_types.go L37-38
            errors.append("rule group has no name set")
        if not str(group.get("folder", "")).strip():  # rules_types.go L47-48
            errors.append("rule group has no folder set")
        if not prometheus_duration(str(group.get("interval", ""))):  # rules_types.go L41
            errors.append(f"group interval {group.get('interval')!r}")
        for rule in group["rules"]:
            title = rule.get("title", "")
            errors += [f"{title}: unknown key {k!r} (dropped)" for k in set(rule) - RULE_FILE_KEYS]
            if not title:  # L90-91
                errors.append("rule has no title set")
            if not rule.get("uid") or not _UID.match(rule["uid"]):  # L94-95
                errors.append(f"rule '{title}' failed to parse: no UID set")
            for key in ("for", "keepFiringFor"):  # L100-104, L110-114
                if key in rule and not prometheus_duration(str(rule[key])):
                    errors.append(f"rule '{title}' failed to parse '{key}' field")
            if rule.get("execErrState", "Alerting") not in EXEC_ERR_STATES:  # L133-135
                errors.append(f"{title}: execErrState")
            if rule.get("noDataState", "NoData") not in NO_DATA_STATES:  # L142-144
                errors.append(f"{title}: noDataState")
            if not rule.get("data"):  # L162-163
                errors.append(f"rule '{title}' failed to parse: no data set")
            refs = [q.get("refId") for q in rule.get("data", [])]
            for q in rule.get("data", []):
                errors += [f"{title}: query key {k!r} (dropped)" for k in set(q) - QUERY_FILE_KEYS]
            if not rule.get("condition"):  # L181-182
                errors.append(f"rule '{title}' failed to parse: no condition set")
            elif rule["condition"] not in refs:  # ngalert ErrConditionNotExistBase
                errors.append(f"Condition {rule['condition']} does not exist, must be one of {refs}")
            errors += check_annotation_pair(rule.get("annotations", {}))
            # dashboardUid/panelId (L65-67, L127-131) must name a dashboard panel that exists
            if "dashboardUid" in rule:
                dash = dashboards.get(rule["dashboardUid"])
                ids = {p["id"] for p in dash["panels"]} if dash else set()
                if rule.get("panelId") not in ids:
                    errors.append(f"{title}: panel {rule.get('panelId')} not in {rule['dashboardUid']}")
            for key, value in rule.get("annotations", {}).items():
                # released Grafana keeps a provisioned rule's annotations as written: no ${VAR}
                if key in ("runbook_url", "dashboard_url") and not re.match(
                    r"^(\{\{ if [^}]+\}\})?https?://", value
                ):
                    errors.append(f"{title}: {key} {value!r} is not absolute")
                if "${" in value:
                    errors.append(f"{title}: {key} holds an unexpanded variable: {value!r}")
            labels = set(re.findall(r"\$labels\.(\w+)", json.dumps(rule.get("annotations", {}))))
            columns = _sql_columns(rule["data"][0]["model"]["rawSql"])
            errors += [f"{title}: annotation uses $labels.{x}, no such label" for x in labels - columns]
    return errors


def _sql_columns(sql: str) -> set[str]:
    """The string columns a rule's first SELECT returns (Grafana turns them into labels)."""
    head = sql.split("\nFROM", 1)[0]
    return set(re.findall(r"\bAS (\w+)", head)) | set(re.findall(r"(?:SELECT|,)\s*(\w+)\s*(?=,|$)", head))


def check_datasource_files(docs: list[dict[str, Any]]) -> list[str]:
    """config_reader.go validateDefaultUniqueness (L104-107): "Only one datasource per organization
    can be marked as default" over every file in the folder; access is proxy or direct (L131)."""
    errors: list[str] = []
    defaults: dict[int, int] = {}
    for doc in docs:
        for ds in doc.get("datasources", []):
            org = ds.get("orgId", 1) or 1
            if ds.get("isDefault"):
                defaults[org] = defaults.get(org, 0) + 1
                if defaults[org] > 1:
                    errors.append("Only one datasource per organization can be marked as default")
            if ds.get("access", "proxy") not in {"proxy", "direct"}:
                errors.append(f"{ds['name']}: access")
    return errors


def expand_env(value: Any, env: dict[str, str]) -> Any:
    """Grafana's provisioning expands $VAR and ${VAR} in datasource values (values.go)."""
    if isinstance(value, dict):
        return {k: expand_env(v, env) for k, v in value.items()}
    if isinstance(value, str):
        return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), value)
    return value


def check_clickhouse_settings(json_data: dict[str, Any]) -> list[str]:
    """clickhouse-datasource LoadSettings/isValid: host non-empty, port parses (strconv.ParseInt)
    and is not 0, secure parses (strconv.ParseBool); protocol is native or http."""
    errors = []
    if not str(json_data.get("host", "")).strip():
        errors.append("invalid host")
    try:
        if int(str(json_data.get("port", "0")), 0) == 0:
            errors.append("invalid port")
    except ValueError:
        errors.append("could not parse port value")
    if str(json_data.get("secure", "false")).lower() not in {"1", "t", "true", "0", "f", "false"}:
        errors.append("could not parse secure value")
    if json_data.get("protocol") not in {"native", "http"}:
        errors.append(f"protocol {json_data.get('protocol')!r}")
    return errors


# The alerting file (v1) as Grafana reads it: pkg/services/provisioning/alerting/types.go
# (AlertingFileV1), contact_point_types.go (ContactPointV1, ReceiverV1.mapToModel: "no name is
# set", "no uid is set", "no type is set", "no settings are set"), notification_policy_types.go
# (the policy is a definition.Route, its strings env-interpolated), mute_times_types.go
# (MuteTimeV1: orgId + an inline MuteTimeInterval); the route's keys, its matchers and the checks
# on receivers and time intervals: definition.Route / ObjectMatchers / checkTimeInterval /
# PostableApiAlertingConfig.Validate in grafana/alerting's definition package (Grafana 12.x).
# Interpolation: pkg/services/provisioning/values/values.go interpolateValue (os.ExpandEnv on
# every string, after setting.ExpandVar: $__env{}, $__file{}; "$$" for a literal "$"), so a
# contact point or policy must hold no "$" but the variables it means.
FILE_KEYS = {
    "apiVersion", "groups", "deleteRules", "contactPoints", "deleteContactPoints", "policies", "resetPolicies",
    "muteTimes", "deleteMuteTimes", "templates", "deleteTemplates",
}  # fmt: skip
CONTACT_POINT_KEYS = {"orgId", "name", "receivers"}
RECEIVER_KEYS = {"uid", "type", "settings", "disableResolveMessage"}
ROUTE_KEYS = {
    "orgId", "receiver", "group_by", "match", "match_re", "matchers", "object_matchers", "mute_time_intervals",
    "active_time_intervals", "continue", "routes", "group_wait", "group_interval", "repeat_interval",
}  # fmt: skip
TIME_INTERVAL_KEYS = {"times", "weekdays", "days_of_month", "months", "years", "location"}
# each integration's required settings (alerting/receivers/*/config.go NewConfig checks)
REQUIRED_SETTINGS = {
    "webhook": [("url",)],
    "slack": [("url",), ("token", "recipient")],
    "pagerduty": [("integrationKey",)],
    "email": [("addresses",)],
}


def check_notifications(doc: dict[str, Any], env: dict[str, str]) -> list[str]:
    """What Grafana's file provisioning refuses in contact points, policies and mute timings,
    with the file's $VAR references expanded from ``env`` as Grafana does (values.JSONValue)."""
    errors = [f"unknown top-level key {k!r} (dropped)" for k in set(doc) - FILE_KEYS]
    stray = set(re.findall(r"\$\{?(\w+)", json.dumps({k: doc.get(k) for k in ("contactPoints", "policies")})))
    errors += [f"${name} would be expanded from Grafana's environment" for name in stray - set(env)]
    names = set()
    for cp in doc.get("contactPoints", []):
        errors += [f"contact point key {k!r} (dropped)" for k in set(cp) - CONTACT_POINT_KEYS]
        name = str(cp.get("name", "")).strip()
        if not name:
            errors.append("no name is set")
        names.add(name)
        for r in cp.get("receivers", []):
            errors += [f"{name}: receiver key {k!r} (dropped)" for k in set(r) - RECEIVER_KEYS]
            if not str(r.get("uid", "")).strip() or not _UID.match(str(r.get("uid"))):
                errors.append(f"{name}: no uid is set")
            typ = str(r.get("type", "")).strip()
            if not typ:
                errors.append(f"{name}: no type is set")
            settings = expand_env(r.get("settings") or {}, env)
            if not settings:
                errors.append(f"{name}: no settings are set")
            elif typ in REQUIRED_SETTINGS and not any(
                all(str(settings.get(k, "")).strip() for k in keys) for keys in REQUIRED_SETTINGS[typ]
            ):
                errors.append(f"{name}: {typ} needs one of {REQUIRED_SETTINGS[typ]}")
            elif typ not in REQUIRED_SETTINGS:
                errors.append(f"{name}: integration type {typ!r} not checked here")
    intervals = [str(m.get("name", "")) for m in doc.get("muteTimes", [])]
    if len(set(intervals)) != len(intervals) or "" in intervals:
        errors.append(f"mute time intervals must be named and unique: {intervals}")
    for m in doc.get("muteTimes", []):
        for ti in m.get("time_intervals", []):
            errors += [f"time interval key {k!r}" for k in set(ti) - TIME_INTERVAL_KEYS]

    def walk(route: dict[str, Any], root: bool) -> None:
        errors.extend(f"route key {k!r} (dropped)" for k in set(route) - ROUTE_KEYS)
        if root and (route.get("continue") or route.get("object_matchers") or route.get("matchers")):
            errors.append("the root route matches everything and cannot continue")
        if route.get("receiver", "") not in names | ({""} if not root else set()):
            errors.append(f"unexpected receiver ({route.get('receiver')}) is undefined")
        for om in route.get("object_matchers", []):
            if len(om) != 3 or om[1] not in ("=", "!=", "=~", "!~"):
                errors.append(f"unsupported match type in matcher {om}")
        for mt in route.get("mute_time_intervals", []) + route.get("active_time_intervals", []):
            if mt not in intervals:
                errors.append(f"undefined mute time interval {mt!r} used in route")
        for key in ("group_wait", "group_interval", "repeat_interval"):
            if key in route and not prometheus_duration(str(route[key])):
                errors.append(f"{key} {route[key]!r}")
        for sub in route.get("routes", []):
            walk(sub, False)

    for policy in doc.get("policies", []):
        walk(policy, True)
    return errors


def route(policy: dict[str, Any], labels: dict[str, str]) -> str:
    """The receiver an alert with ``labels`` reaches (Alertmanager: first matching child, depth first)."""

    def matches(r: dict[str, Any]) -> bool:
        ops = {"=": lambda a, b: a == b, "!=": lambda a, b: a != b}
        return all(ops[op](labels.get(k, ""), v) for k, op, v in r.get("object_matchers", []))

    node = policy
    while True:
        child = next((c for c in node.get("routes", []) if matches(c)), None)
        if child is None:
            return str(node["receiver"])
        node = {**child, "receiver": child.get("receiver") or node["receiver"]}


ENV = {"ARGUS_ALERT_WEBHOOK_URL": "https://hooks.example.com/argus"}


def _files(root: Path) -> dict[str, Any]:
    return {
        "rules": yaml.safe_load((root / "provisioning/alerting/argus.yaml").read_text())
        if (root / "provisioning").exists()
        else yaml.safe_load((root / "alerting/argus.yaml").read_text()),
        # the chart renders its datasource from values (tests/deploy/test_helm.py checks it)
        "datasource": yaml.safe_load((root / "provisioning/datasources/argus.yaml").read_text())
        if (root / "provisioning").exists()
        else None,
        "dashboards": {p.stem: json.loads(p.read_text()) for p in (root / "dashboards").glob("*.json")},
    }


@pytest.mark.parametrize("root", [DEPLOY, CHART], ids=["deploy", "chart"])
def test_alert_rule_files_pass_grafanas_rule_provisioning(root: Path) -> None:
    files = _files(root)
    assert check_rule_file(files["rules"], files["dashboards"]) == []
    rules = files["rules"]["groups"][0]["rules"]
    assert {r["uid"] for r in rules} == {a.uid for a in ALERTS}
    assert all(r["keepFiringFor"] == a.keep_firing for r, a in zip(rules, ALERTS, strict=True))


def test_the_rule_checks_catch_what_grafana_refuses() -> None:
    """The checks fail on the files issue 19 found (and on each rule broken on purpose)."""
    files = _files(DEPLOY)
    bad = json.loads(json.dumps(files["rules"]))
    rule = bad["groups"][0]["rules"][0]
    rule["annotations"]["__dashboardUid__"] = "argus-job"  # without __panelId__
    rule["keep_firing_for"] = rule.pop("keepFiringFor")  # the API's key in a file
    rule["annotations"]["runbook_url"] = "${ARGUS_GRAFANA_URL}/d/argus-rank/x?var-rank={{ $labels.nope }}"
    rule["condition"] = "D"
    errors = check_rule_file(bad, files["dashboards"])
    assert any("__panelId__ must be specified" in e for e in errors)
    assert any("'keep_firing_for' (dropped)" in e for e in errors)
    assert any("not absolute" in e for e in errors) and any("$labels.nope" in e for e in errors)
    assert any("unexpanded variable" in e for e in errors)
    assert any("Condition D does not exist" in e for e in errors)
    assert check_annotation_pair({"__dashboardUid__": "a", "__panelId__": "x"})


def test_datasource_is_never_a_second_default_and_its_settings_load() -> None:
    ours = _files(DEPLOY)["datasource"]
    kube_prometheus_stack = {  # the Grafana chart's sidecar datasource in kube-prometheus-stack
        "apiVersion": 1,
        "datasources": [{"name": "Prometheus", "type": "prometheus", "uid": "prometheus", "isDefault": True}],
    }
    assert check_datasource_files([kube_prometheus_stack, ours]) == []
    assert check_datasource_files([kube_prometheus_stack, kube_prometheus_stack])  # the check can fail
    (ds,) = ours["datasources"]
    assert ds["type"] == DATASOURCE_TYPE and ds["isDefault"] is False
    https = {
        "ARGUS_CLICKHOUSE_HOST": "ch.example.com",
        "ARGUS_CLICKHOUSE_PORT": "8443",
        "ARGUS_CLICKHOUSE_PROTOCOL": "http",
        "ARGUS_CLICKHOUSE_SECURE": "true",
    }
    loaded = expand_env(ds["jsonData"], https)
    assert check_clickhouse_settings(loaded) == []
    assert (loaded["port"], loaded["secure"], loaded["protocol"]) == ("8443", "true", "http")
    assert check_clickhouse_settings(expand_env(ds["jsonData"], {})) != []  # unset env is caught


def test_dashboards_pass_grafanas_save_checks_and_link_job_rank_kernel() -> None:
    """dashboard_service.go BuildSaveDashboardCommand: IsValidShortUID / IsShortUIDTooLong (uid
    [a-zA-Z0-9-_], at most 40: "uid too long, max 40 characters"); a title is required."""
    files = _files(DEPLOY)["dashboards"]
    assert set(files) == {d.uid for d in DASHBOARDS} | {PIPELINE.uid}
    for uid, doc in files.items():
        assert _UID.match(doc["uid"]) and doc["uid"] == uid and doc["title"]
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids))
    links = {
        uid: [
            link["url"]
            for p in doc["panels"]
            for o in p["fieldConfig"]["overrides"]
            for prop in o["properties"]
            if prop["id"] == "links"
            for link in prop["value"]
        ]
        for uid, doc in files.items()
    }
    assert any(u.startswith("/d/argus-rank/") for u in links["argus-job"])  # job -> rank
    assert any(u.startswith("/d/argus-kernel/") for u in links["argus-rank"])  # rank -> kernel
    assert any(u.startswith("/d/argus-rank/") for u in links["argus-kernel"])  # kernel -> ranks
    assert any(u.startswith("/d/argus-job/") for u in links["argus-anomalies"])  # anomaly -> job
    assert all("${datasource:queryparam}" in u for urls in links.values() for u in urls)
    pipeline = files["argus-pipeline"]
    exprs = " ".join(t["expr"] for p in pipeline["panels"] for t in p["targets"])
    for metric in (
        "argus_worker_consumer_lag",
        "argus_worker_dead_letters_total",
        "argus_sink_insert_retries_total",
        "argus_relay_refused_total",
        "argus_worker_step_completion_seconds_bucket",
    ):
        assert metric in exprs


def test_api_bodies_use_the_apis_keys_and_the_annotation_pair() -> None:
    """The provisioning API (definitions ProvisionedAlertRule) reads keep_firing_for; its rules go
    through SetDashboardAndPanelFromAnnotations, so the pair is both set."""
    bodies = api_alert_rules(GrafanaOptions(base_url="https://grafana.example.com"), folder_uid="argus")
    for body, rule in zip(bodies, ALERTS, strict=True):
        assert body["keep_firing_for"] == rule.keep_firing and "keepFiringFor" not in body
        assert check_annotation_pair(body["annotations"]) == [] and body["annotations"]["__panelId__"]
        assert "https://grafana.example.com/d/" in body["annotations"]["dashboard_url"]
        assert body["annotations"]["runbook_url"].startswith(DOCS_URL + "#")
        assert body["condition"] in [q["refId"] for q in body["data"]]
        assert (body["folderUID"], body["ruleGroup"]) == ("argus", "argus")


@pytest.mark.parametrize("root", [DEPLOY, CHART], ids=["deploy", "chart"])
def test_contact_points_policies_and_mute_timing_pass_grafanas_file_provisioning(root: Path) -> None:
    path = root / ("provisioning/alerting" if root == DEPLOY else "alerting") / "notifications.yaml"
    doc = yaml.safe_load(path.read_text())
    assert check_notifications(doc, ENV) == []
    (policy,) = doc["policies"]
    page = {"source": "argus", "severity": "page", "alertname": "Argus: slow rank", "job": "j", "team": "llm"}
    assert route(policy, page) == "argus-oncall"
    assert (
        route(policy, {**page, "severity": "ticket"}) == "argus-platform"
    )  # fleet: node suspect across jobs
    assert route(policy, {"alertname": "DatasourceError"}) == "argus-platform"
    assert policy["group_by"] == ["alertname", "job"] and policy["repeat_interval"]
    # an unset secret is what Grafana refuses at start-up: the check sees it
    assert any("webhook needs" in e for e in check_notifications(doc, {}))


def test_every_integration_and_a_team_route_validate_and_route() -> None:
    doc = notifications(
        GrafanaOptions(
            integrations=("webhook", "slack", "pagerduty", "email"), team_routes=(("llm", "llm-pager"),)
        )
    )
    env = {
        **ENV,
        "ARGUS_SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T/B/x",
        "ARGUS_PAGERDUTY_KEY": "k",
        "ARGUS_ALERT_EMAIL": "oncall@example.com",
    }
    doc["contactPoints"].append(
        {"orgId": 1, "name": "llm-pager", "receivers": doc["contactPoints"][0]["receivers"]}
    )
    assert check_notifications(doc, env) == []
    (policy,) = doc["policies"]
    page = {"source": "argus", "severity": "page", "team": "llm"}
    assert route(policy, page) == "llm-pager" and route(policy, {**page, "team": "vision"}) == "argus-oncall"
    bad = json.loads(json.dumps(doc))
    bad["policies"][0]["routes"][0]["mute_time_intervals"] = ["nope"]
    bad["policies"][0]["routes"][1]["receiver"] = "nobody"
    bad["contactPoints"][0]["receivers"][0]["uid"] = ""
    errors = check_notifications(bad, env)
    assert any("undefined mute time interval" in e for e in errors)
    assert any("(nobody) is undefined" in e for e in errors) and any("no uid is set" in e for e in errors)
    with pytest.raises(ValueError, match="absolute"):
        GrafanaOptions(base_url="${ARGUS_GRAFANA_URL}")


@pytest.mark.parametrize("root", [DEPLOY, CHART], ids=["deploy", "chart"])
def test_rule_annotations_link_to_on_call_anchors_and_expand_nothing_at_load(root: Path) -> None:
    """runbook_url is docs/on-call.md#<anchor> (per cause: the rule's cause label), the
    dashboard link absolute; no ${...} is left for Grafana (it would stay literal)."""
    rules = _files(root)["rules"]["groups"][0]["rules"]
    anchors = set(re.findall(r'<a id="([\w-]+)"></a>', (REPO / "docs" / "on-call.md").read_text()))
    for rule in rules:
        text = yaml.safe_dump(rule["annotations"])
        assert "${" not in text, rule["uid"]
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(DOCS_URL + "#")
        anchor = url.split("#", 1)[1]
        if anchor == "{{ $labels.cause }}":
            from argus.schemas.causes import FAULT_CAUSES, UNKNOWN

            assert {*FAULT_CAUSES, UNKNOWN} <= anchors
        else:
            assert anchor in anchors, anchor
        assert rule["uid"] in anchors
        assert "http://localhost:3000/d/" in rule["annotations"]["dashboard_url"]


def test_export_writes_the_sites_urls_integrations_and_team_routes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from argus.cli import app

    args = ["grafana", "export", "--out", str(tmp_path), "--base-url", "https://grafana.example.com"]
    args += ["--integration", "pagerduty", "--integration", "slack", "--team-route", "llm=llm-pager"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rules = (tmp_path / "provisioning/alerting/argus.yaml").read_text()
    assert "${" not in rules and "https://grafana.example.com/d/argus-" in rules and "localhost" not in rules
    doc = yaml.safe_load((tmp_path / "provisioning/alerting/notifications.yaml").read_text())
    assert [r["type"] for r in doc["contactPoints"][0]["receivers"]] == ["pagerduty", "slack"]
    assert doc["policies"][0]["routes"][0]["routes"] == [
        {"receiver": "llm-pager", "object_matchers": [["team", "=", "llm"]]}
    ]
    for bad in (
        ["--base-url", "${ARGUS_GRAFANA_URL}"],
        ["--integration", "carrier-pigeon"],
        ["--team-route", "llm"],
    ):
        result = CliRunner().invoke(app, ["grafana", "export", "--out", str(tmp_path), *bad])
        assert result.exit_code != 0 and "Traceback" not in result.output, bad
