"""The Helm chart: `helm lint`, and the manifests `helm template` renders (workloads, probes,
resource requests, secrets referenced and never inlined, KEDA/HPA, Grafana ConfigMaps)."""

from __future__ import annotations

import base64
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "argus"
CACHE = Path(os.environ.get("ARGUS_CACHE", Path.home() / ".cache" / "argus"))
HELM_VERSION = "v3.16.4"
SECRETISH = re.compile(r"PASSWORD|TOKEN|SECRET")

SECURE = [
    "kafka.securityProtocol=SASL_SSL",
    "kafka.sasl.mechanism=SCRAM-SHA-512",
    "kafka.sasl.existingSecret=kafka-sasl",
    "kafka.tls.existingSecret=kafka-ca",
    "kafka.tls.certKey=tls.crt",
    "clickhouse.existingSecret=clickhouse-creds",
    "clickhouse.url=https://ch.example:8443",
    "clickhouse.caSecret=clickhouse-ca",
    "grafana.push=true",
    "grafana.url=https://grafana.example",
    "grafana.existingSecret=grafana-token",
    "fleet.record.enabled=true",
]
EXISTING = {"kafka-sasl", "kafka-ca", "clickhouse-creds", "clickhouse-ca", "grafana-token"}


@cache
def helm() -> str:
    """A helm binary: on PATH, in the cache, or built once with Go into the cache."""
    for candidate in (
        os.environ.get("HELM"),
        shutil.which("helm"),
        str(CACHE / "bin" / "helm"),
        str(Path.home() / "go" / "bin" / "helm"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    if shutil.which("go") is None:
        pytest.skip("no helm binary and no Go toolchain to build one (`make helm`)")
    env = {**os.environ, "GOBIN": str(CACHE / "bin")}
    subprocess.run(
        ["go", "install", f"helm.sh/helm/v3/cmd/helm@{HELM_VERSION}"], env=env, check=True, timeout=1800
    )
    return str(CACHE / "bin" / "helm")


def render(*sets: str) -> list[dict[str, Any]]:
    args = [helm(), "template", "argus", str(CHART), "--namespace", "gpu-obs"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        if d["kind"] in ("Deployment", "DaemonSet", "Job"):
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]
        elif d["kind"] == "CronJob":
            yield d["metadata"]["name"], d["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def test_helm_lint_passes_strict() -> None:
    out = subprocess.run(
        [helm(), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    bad = subprocess.run(
        [helm(), "lint", str(CHART), "--set", "kafka.securityProtocol=TLS"], capture_output=True, text=True
    )
    assert bad.returncode != 0 and "securityProtocol" in bad.stdout + bad.stderr  # values.schema.json


def test_default_render_has_every_workload() -> None:
    docs = render()
    assert set(by_kind(docs, "Deployment")) == {"argus-worker", "argus-sink"}
    assert set(by_kind(docs, "DaemonSet")) == {"argus-node-agent"}
    assert set(by_kind(docs, "Service")) == {"argus-worker", "argus-sink"}
    assert set(by_kind(docs, "ConfigMap")) == {"argus-dashboards", "argus-datasource"}  # alerting: opt-in
    assert not by_kind(docs, "Secret") and not by_kind(docs, "HorizontalPodAutoscaler")
    assert all(d["metadata"].get("namespace", "gpu-obs") == "gpu-obs" for d in docs)
    agent = by_kind(docs, "DaemonSet")["argus-node-agent"]["spec"]["template"]["spec"]
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in agent["tolerations"])
    assert "initContainers" not in agent and all(v["name"] != "relay" for v in agent["volumes"])


def test_the_node_relay_shares_a_host_directory_the_agent_owns(tmp_path: Path) -> None:
    docs = render("nodeAgent.relay.enabled=true")
    agent = by_kind(docs, "DaemonSet")["argus-node-agent"]["spec"]["template"]["spec"]
    (relay,) = [v for v in agent["volumes"] if v["name"] == "relay"]
    assert relay["hostPath"] == {"path": "/run/argus", "type": "DirectoryOrCreate"}
    (container,) = agent["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ARGUS_RELAY_SOCKET"] == "/run/argus/relay.sock"
    assert env["ARGUS_RELAY_ALLOWED_GIDS"] == "10001"  # the directory's group
    assert "ARGUS_RELAY_ALLOWED_UIDS" not in env
    assert {"name": "relay", "mountPath": "/run/argus"} in container["volumeMounts"]
    (init,) = agent["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert {"name": "relay", "mountPath": "/run/argus"} in init["volumeMounts"]
    # Run the init command as the container would: root with CAP_CHOWN only, on a directory
    # kubelet just created (root's, 0755 or stricter).
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("running the init command with only CAP_CHOWN needs root and setpriv")
    host = tmp_path / "run-argus"
    host.mkdir(mode=0o700)
    python, flag, code = init["command"]
    assert (python, flag) == ("python", "-c")
    done = subprocess.run(
        [
            "setpriv",
            "--bounding-set=-all,+chown",
            sys.executable,
            "-c",
            code.replace("/run/argus", str(host)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    st = host.stat()
    assert st.st_uid == 10001 and st.st_gid == 10001 and stat.S_IMODE(st.st_mode) == 0o750


@pytest.mark.parametrize(
    "sets", [[], SECURE, ["nodeAgent.relay.enabled=true"]], ids=["default", "secure", "relay"]
)
def test_every_container_requests_resources_and_runs_what_argus_accepts(
    sets: list[str],
    argus_accepts: Callable[[list[str]], None],
    argus_settings: Callable[[Iterable[str]], None],
) -> None:
    for name, spec in pod_specs(render(*sets)):
        for c in spec["containers"]:
            requests = c["resources"]["requests"]
            assert requests.get("cpu") and requests.get("memory"), name
            assert c["resources"]["limits"]["memory"], name
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, name
            argus_accepts([a.replace("$(NODE_NAME)", "node-1") for a in c["args"]])
            argus_settings(e["name"] for e in c.get("env", []))
        assert spec["securityContext"]["runAsNonRoot"] is True, name


def test_the_fleet_recording_is_an_opt_in_hourly_cronjob_writing_to_clickhouse(
    argus_accepts: Callable[[list[str]], None], argus_settings: Callable[[Iterable[str]], None]
) -> None:
    """`argus fleet --record` fills node_suspects, which the fleet dashboard and the
    argus-node-suspect alert read: a CronJob when asked for, with the sink's ClickHouse
    settings, one run at a time."""
    assert not by_kind(render(), "CronJob")
    docs = render(*SECURE, "fleet.record.since=14d", "fleet.record.timeZone=Europe/Paris")
    cron = by_kind(docs, "CronJob")["argus-fleet-record"]["spec"]
    assert (cron["schedule"], cron["timeZone"], cron["concurrencyPolicy"]) == (
        "17 * * * *",
        "Europe/Paris",
        "Forbid",
    )
    job = cron["jobTemplate"]["spec"]
    assert job["activeDeadlineSeconds"] == 1800 and job["template"]["spec"]["restartPolicy"] == "OnFailure"
    (c,) = job["template"]["spec"]["containers"]
    assert c["args"] == ["fleet", "--record", "--since", "14d"]
    argus_accepts(c["args"])
    argus_settings(e["name"] for e in c["env"])
    env = {e["name"]: e for e in c["env"]}
    sink = by_kind(docs, "Deployment")["argus-sink"]["spec"]["template"]["spec"]["containers"][0]
    same = {e["name"]: e for e in sink["env"] if e["name"].startswith("ARGUS_CLICKHOUSE")}
    assert same and {k: env[k] for k in same} == same  # the sink's store, user, password file and CA
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/etc/argus/secrets/clickhouse", "/etc/argus/secrets/clickhouse-ca", "/tmp"} <= mounts
    bad = subprocess.run(
        [
            helm(),
            "lint",
            str(CHART),
            "--set",
            "fleet.record.enabled=true",
            "--set",
            "fleet.record.since=a week",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "since" in bad.stdout + bad.stderr  # values.schema.json


def test_deployments_probe_the_metrics_port_their_command_opens() -> None:
    docs = render()
    for name, dep in by_kind(docs, "Deployment").items():
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        port = int(c["args"][c["args"].index("--metrics-port") + 1])
        assert c["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}], name
        # argus worker/sink serve /livez and /readyz beside /metrics (tests/argus/test_cli.py
        # checks each command answers them): the probes check the consumer and the store
        assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}, name
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}, name
        svc = by_kind(docs, "Service")[name]
        assert svc["spec"]["ports"][0]["port"] == port
        assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    agent = by_kind(docs, "DaemonSet")["argus-node-agent"]["spec"]["template"]["spec"]["containers"][0]
    port = int(agent["args"][agent["args"].index("--metrics-port") + 1])
    assert agent["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe"):  # /healthz: 503 once the relay thread stops
        assert agent[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe


def test_secrets_are_referenced_never_inlined() -> None:
    docs = render(*SECURE)
    assert not by_kind(docs, "Secret")  # existing Secrets only
    referenced: set[str] = set()
    for name, spec in pod_specs(docs):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for v in volumes.values():
            if "secret" in v:
                referenced.add(v["secret"]["secretName"])
        for c in spec["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            for e in c.get("env", []):
                if ref := e.get("valueFrom", {}).get("secretKeyRef"):
                    referenced.add(ref["name"])
                    continue
                if not SECRETISH.search(e["name"]):
                    continue
                # a secret setting is a file in a mounted Secret, never a value
                assert e["name"].endswith("_FILE"), (name, e)
                folder = str(Path(e["value"]).parent)
                assert folder in mounts and "secret" in volumes[mounts[folder]], (name, e)
    assert referenced == EXISTING
    keda = by_kind(render(*SECURE, "worker.keda.enabled=true"), "TriggerAuthentication")["argus-kafka"]
    assert {r["name"] for r in keda["spec"]["secretTargetRef"]} == {"kafka-sasl", "kafka-ca"}


def test_created_secrets_hold_the_values_and_nothing_else_does() -> None:
    password = "s3cret-Xq81-password"
    docs = render(
        "secrets.create=true",
        "kafka.securityProtocol=SASL_PLAINTEXT",
        "kafka.sasl.mechanism=PLAIN",
        "secrets.kafkaSasl.username=argus",
        f"secrets.kafkaSasl.password={password}",
        "secrets.clickhouse.username=argus",
        f"secrets.clickhouse.password={password}",
    )
    secrets = by_kind(docs, "Secret")
    assert set(secrets) == {"argus-kafka-sasl", "argus-clickhouse"}
    encoded = base64.b64encode(password.encode()).decode()
    assert secrets["argus-clickhouse"]["data"]["password"] == encoded
    for d in docs:
        if d["kind"] != "Secret":
            text = yaml.safe_dump(d)
            assert password not in text and encoded not in text, d["metadata"]["name"]


def test_keda_scales_workers_on_their_consumer_lag_and_the_hpa_is_the_fallback() -> None:
    docs = render("worker.keda.enabled=true", "worker.keda.maxReplicas=500")
    (so,) = by_kind(docs, "ScaledObject").values()
    worker = by_kind(docs, "Deployment")["argus-worker"]
    args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "kafka" and trigger["metadata"]["topic"] == "argus.steps"
    assert trigger["metadata"]["consumerGroup"] == args[args.index("--app-id") + 1]
    assert so["spec"]["scaleTargetRef"]["name"] == "argus-worker"
    assert so["spec"]["maxReplicaCount"] == 64  # never more workers than partitions
    assert "replicas" not in worker["spec"]  # the autoscaler owns it
    assert not by_kind(docs, "HorizontalPodAutoscaler")

    docs = render("worker.autoscaling.enabled=true")
    (hpa,) = by_kind(docs, "HorizontalPodAutoscaler").values()
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "argus-worker",
    }
    assert not by_kind(docs, "ScaledObject")

    both = subprocess.run(
        [
            helm(),
            "template",
            "a",
            str(CHART),
            "--set",
            "worker.keda.enabled=true",
            "--set",
            "worker.autoscaling.enabled=true",
        ],
        capture_output=True,
        text=True,
    )
    assert both.returncode != 0 and "exclude each other" in both.stderr


ALERTING = ["grafana.alerting.enabled=true", "grafana.alerting.baseUrl=https://grafana.example.com/"]


def test_grafana_configmaps_carry_the_generated_dashboards_and_alert_rules() -> None:
    grafana = REPO / "deploy" / "grafana"
    files = CHART / "files" / "grafana"
    pairs = {
        **{files / "dashboards" / p.name: p for p in (grafana / "dashboards").glob("*.json")},
        **{files / "alerting" / p.name: p for p in (grafana / "provisioning" / "alerting").glob("*.yaml")},
    }
    for copy, original in pairs.items():
        assert copy.is_file() and copy.read_text() == original.read_text(), f"run `make helm-files` ({copy})"
    maps = by_kind(render(*ALERTING), "ConfigMap")
    dashboards = maps["argus-dashboards"]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert set(dashboards["data"]) == {p.name for p in (grafana / "dashboards").glob("*.json")}
    for name, text in dashboards["data"].items():
        assert text == (grafana / "dashboards" / name).read_text()
    rules = maps["argus-alert-rules"]
    assert rules["metadata"]["labels"]["grafana_alert"] == "1"
    assert set(rules["data"]) == {"argus.yaml", "notifications.yaml"}
    assert yaml.safe_load(rules["data"]["argus.yaml"])["groups"][0]["rules"]
    assert yaml.safe_load(rules["data"]["notifications.yaml"])["policies"]
    assert maps["argus-datasource"]["metadata"]["labels"]["grafana_datasource"] == "1"


def test_alerting_needs_an_absolute_base_url_and_renders_no_variable_into_annotations() -> None:
    """Released Grafana keeps a provisioned rule's annotations raw: the chart writes the base
    and docs URLs into them (grafana.alerting.baseUrl, required; docsUrl)."""
    assert "argus-alert-rules" not in by_kind(render(), "ConfigMap")  # alerting is opt-in
    args = [helm(), "template", "argus", str(CHART), "--set", "grafana.alerting.enabled=true"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "grafana.alerting.baseUrl" in out.stderr
    out = subprocess.run(
        [*args, "--set", "grafana.alerting.baseUrl=${GF_URL}"], capture_output=True, text=True
    )
    assert out.returncode != 0  # the schema refuses a variable
    docs_url = "https://wiki.example.com/argus/on-call.md"
    rules = by_kind(render(*ALERTING, f"grafana.alerting.docsUrl={docs_url}"), "ConfigMap")[
        "argus-alert-rules"
    ]
    assert "${" not in rules["data"]["argus.yaml"]  # in no annotation, nor anywhere else in the rules
    for rule in yaml.safe_load(rules["data"]["argus.yaml"])["groups"][0]["rules"]:
        assert rule["annotations"]["runbook_url"].startswith(docs_url + "#")
        assert "https://grafana.example.com/d/" in rule["annotations"]["dashboard_url"]
        assert "localhost" not in rule["annotations"]["dashboard_url"]
    off = by_kind(render(*ALERTING, "grafana.alerting.notifications=false"), "ConfigMap")["argus-alert-rules"]
    assert set(off["data"]) == {"argus.yaml"}


def test_the_datasource_follows_clickhouse_url_and_is_never_the_default() -> None:
    """Grafana's provisioning refuses a second default datasource per organization
    (pkg/services/provisioning/datasources/config_reader.go, validateDefaultUniqueness)."""
    (ds,) = yaml.safe_load(by_kind(render(*SECURE), "ConfigMap")["argus-datasource"]["data"]["argus.yaml"])[
        "datasources"
    ]
    assert ds["isDefault"] is False and ds["uid"] == "argus-clickhouse"
    assert {"host": "ch.example", "port": "8443", "protocol": "http", "secure": True}.items() <= ds[
        "jsonData"
    ].items()
    assert ds["secureJsonData"] == {"password": "$ARGUS_CLICKHOUSE_PASSWORD"}
    maps = by_kind(render("grafana.datasource.uid=ch-prod", "clickhouse.url=http://ch:8123"), "ConfigMap")
    (ds,) = yaml.safe_load(maps["argus-datasource"]["data"]["argus.yaml"])["datasources"]
    assert (ds["uid"], ds["jsonData"]["port"], ds["jsonData"]["secure"]) == ("ch-prod", "8123", False)


MONITORING = ["serviceMonitor.enabled=true", "prometheusRule.enabled=true"]


def test_monitoring_objects_render_lint_and_carry_the_documented_labels() -> None:
    sets = [
        *MONITORING,
        "serviceMonitor.labels.release=kube-prometheus-stack",
        "prometheusRule.labels.release=kps",
    ]
    args = [helm(), "lint", "--strict", str(CHART)]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    docs = render(*sets)
    monitors = by_kind(docs, "ServiceMonitor")
    assert set(monitors) == {"argus-worker", "argus-sink"}
    services = by_kind(docs, "Service")
    for name, sm in monitors.items():
        labels = sm["metadata"]["labels"]
        assert labels["release"] == "kube-prometheus-stack" and labels["app.kubernetes.io/part-of"] == "argus"
        assert sm["spec"]["selector"]["matchLabels"].items() <= services[name]["metadata"]["labels"].items()
        assert sm["spec"]["endpoints"][0]["port"] == services[name]["spec"]["ports"][0]["name"]
    (pm,) = by_kind(docs, "PodMonitor").values()
    agent = by_kind(docs, "DaemonSet")["argus-node-agent"]["spec"]["template"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= agent["metadata"]["labels"].items()
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == agent["spec"]["containers"][0]["ports"][0]["name"]
    (rule,) = by_kind(docs, "PrometheusRule").values()
    assert rule["metadata"]["labels"]["release"] == "kps"
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) >= {"ArgusConsumerLagHigh", "ArgusDeadLetters", "ArgusSinkRetrying", "ArgusStoreDown"}
    assert "argus_worker_step_completion_seconds_bucket" in alerts["ArgusStepLatencyHigh"]["expr"]
    for r in alerts.values():
        assert (
            r["labels"]["source"] == "argus"
            and "docs/on-call.md#" + r["alert"].lower() in r["annotations"]["description"]
        )
        assert r["annotations"]["runbook_url"].endswith("/docs/on-call.md#" + r["alert"].lower())
    # every worker reports the whole group's lag: counted once (max), not once per replica
    assert alerts["ArgusConsumerLagHigh"]["expr"].startswith("max by (namespace, topic)")
    assert "by (namespace, pod)" in alerts["ArgusRelayRefusing"]["expr"]  # a label the PodMonitor sets
    on_call = (REPO / "docs" / "on-call.md").read_text().lower()
    assert all(f"### {name.lower()}" in on_call for name in alerts), "every alert has an on-call section"


def test_monitoring_is_off_by_default_and_the_schema_refuses_typos() -> None:
    kinds = {d["kind"] for d in render()}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    args = [helm(), "template", "argus", str(CHART), "--set", "serviceMonitor.enabeld=true"]
    assert subprocess.run(args, capture_output=True, text=True, timeout=120).returncode != 0


def test_relay_senders_are_configurable() -> None:
    docs = render(
        "nodeAgent.relay.enabled=true", "nodeAgent.relay.group=3000", "nodeAgent.relay.allowedUids={0,1000}"
    )
    agent = by_kind(docs, "DaemonSet")["argus-node-agent"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in agent["containers"][0]["env"]}
    assert (env["ARGUS_RELAY_ALLOWED_GIDS"], env["ARGUS_RELAY_ALLOWED_UIDS"]) == ("3000", "0,1000")
    assert "0o750" in agent["initContainers"][0]["command"][2]
    assert ", 3000)" in agent["initContainers"][0]["command"][2]


def test_metrics_bind_the_pod_ip_not_every_interface() -> None:
    docs = render()
    for name in ("argus-worker", "argus-sink"):
        (container,) = by_kind(docs, "Deployment")[name]["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["ARGUS_METRICS_ADDR"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
