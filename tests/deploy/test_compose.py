"""docker-compose.yml is consistent (Docker cannot run here: the file is checked as data)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
VAR = re.compile(r"\$\{(?P<name>[A-Z0-9_]+)(?P<op>:?[-?+])?(?P<arg>[^}]*)\}")
SECRETISH = re.compile(r"PASSWORD|TOKEN|SECRET|_KEY$")


def env_example() -> dict[str, str]:
    out = {}
    for line in (REPO / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            out[name] = value
    return out


def strings(node: Any) -> list[str]:
    """Every string anywhere in ``node``."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in (*strings(k), *strings(v))]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return []


def test_the_whole_system_is_there() -> None:
    assert set(SERVICES) == {"kafka", "clickhouse", "grafana", "worker", "sink", "simulated-job"}
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:")
    assert SERVICES["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    assert SERVICES["grafana"]["image"].startswith("grafana/grafana:")
    assert "grafana-clickhouse-datasource" in SERVICES["grafana"]["environment"]["GF_INSTALL_PLUGINS"]


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_images_are_pinned_and_built_from_files_that_exist(name: str) -> None:
    svc = SERVICES[name]
    image = svc["image"]
    repo, _, tag = image.rpartition(":")
    assert repo and tag and tag != "latest" and re.search(r"\d", tag), f"{name}: unpinned image {image}"
    if "build" in svc:
        context = REPO / svc["build"]["context"]
        assert (context / svc["build"].get("dockerfile", "Dockerfile")).is_file()


def test_kafka_image_is_the_version_the_local_broker_runs() -> None:
    pom = (REPO / "scripts" / "kafka" / "pom.xml").read_text()
    version = re.search(r"<kafka.version>(.+?)</kafka.version>", pom)
    assert version is not None
    assert SERVICES["kafka"]["image"] == f"apache/kafka:{version.group(1)}"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_healthcheck(name: str) -> None:
    check = SERVICES[name].get("healthcheck")
    assert check and check["test"][0] in ("CMD", "CMD-SHELL"), name
    assert check.get("interval") and check.get("retries"), name


def test_dependencies_wait_for_health_of_services_that_have_it() -> None:
    for name, svc in SERVICES.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
            assert cond["condition"] == "service_healthy"
            assert "healthcheck" in SERVICES[dep]


def test_host_ports_are_unique_and_container_ports_match_what_listens() -> None:
    host_ports: list[str] = []
    for svc in SERVICES.values():
        for p in svc.get("ports", []):
            host, _, container = str(p).rpartition(":")
            assert host and container, p
            host_ports.append(host)
    assert len(host_ports) == len(set(host_ports)), host_ports
    listeners = SERVICES["kafka"]["environment"]["KAFKA_LISTENERS"]
    assert ":9094" in listeners and "127.0.0.1:9094:9094" in SERVICES["kafka"]["ports"]
    for name, port in (("worker", "9464"), ("sink", "9465")):
        cmd = SERVICES[name]["command"]
        assert cmd[cmd.index("--metrics-port") + 1] == port
        assert port in SERVICES[name]["expose"]
        assert port in " ".join(SERVICES[name]["healthcheck"]["test"])
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^EXPOSE 9464 9465 9466$", dockerfile, re.M)  # worker, sink, node agent


def test_bind_mounts_exist_and_named_volumes_are_declared() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    for name, svc in SERVICES.items():
        for v in svc.get("volumes", []):
            source = v.split(":")[0]
            if source.startswith((".", "/")):
                assert (REPO / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} not declared"


def test_grafana_gets_the_provisioned_dashboards_and_everything_the_datasource_reads() -> None:
    graf = SERVICES["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in graf["volumes"]}
    assert mounts["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    providers = yaml.safe_load((REPO / "deploy/grafana/provisioning/dashboards/argus.yaml").read_text())
    path = providers["providers"][0]["options"]["path"]
    assert mounts[path] == "./deploy/grafana/dashboards"
    assert list((REPO / "deploy/grafana/dashboards").glob("*.json"))
    assert (REPO / "deploy/grafana/provisioning/alerting/argus.yaml").is_file()
    # Grafana expands $VAR / ${VAR} from its environment in datasources, contact points, policies
    for path in ("datasources/argus.yaml", "alerting/notifications.yaml"):
        text = (REPO / "deploy/grafana/provisioning" / path).read_text()
        for var in set(re.findall(r"\$\{?(ARGUS_[A-Z_]+)", text)):
            assert var in graf["environment"], var
    port = graf["environment"]["ARGUS_CLICKHOUSE_PORT"]
    assert SERVICES["clickhouse"]["ports"].count(f"127.0.0.1:{port}:{port}") == 1  # the datasource's port
    assert graf["environment"]["ARGUS_CLICKHOUSE_PROTOCOL"] == "http"  # port 8123 is ClickHouse's HTTP


def test_every_variable_is_in_env_example_and_no_secret_is_inlined() -> None:
    example = env_example()
    used = {m["name"]: m for s in strings(COMPOSE) for m in VAR.finditer(s)}
    assert used, "the file uses no variables?"
    for name in used:
        assert name in example, f"${{{name}}} is not documented in .env.example"
    for name, value in example.items():
        if SECRETISH.search(name):
            assert value == "", f".env.example must not carry a value for {name}"
    for svc_name, svc in SERVICES.items():
        for key, value in (svc.get("environment") or {}).items():
            if SECRETISH.search(key):
                m = VAR.fullmatch(str(value))
                assert m and m["op"] == ":?", (
                    f"{svc_name}.{key} must be ${{VAR:?...}} from .env, not a literal"
                )


@pytest.mark.parametrize("name", ["worker", "sink", "simulated-job"])
def test_argus_services_run_commands_the_cli_accepts(
    name: str, argus_accepts: Callable[[list[str]], None], argus_settings: Callable[[Iterable[str]], None]
) -> None:
    svc = SERVICES[name]
    assert svc["image"] == SERVICES["worker"]["image"]
    argus_accepts([VAR.sub(lambda m: m["arg"] or env_example()[m["name"]], str(a)) for a in svc["command"]])
    env = svc["environment"]
    assert env["ARGUS_KAFKA_BOOTSTRAP"] == "kafka:9092"
    assert all(k.startswith("ARGUS_") for k in env)
    argus_settings(env)


def test_dockerignore_keeps_the_image_small_and_secrets_out() -> None:
    ignored = (REPO / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", ".argus", ".env"):
        assert entry in ignored
    dockerfile = (REPO / "Dockerfile").read_text()
    for copied in re.findall(r"^COPY (?!--from=)(\S+)", dockerfile, re.M):  # the build context's files
        assert copied.rstrip("/") not in ignored, copied
        assert (REPO / copied).exists(), copied


def test_kafka_and_clickhouse_publish_on_this_machine_only() -> None:
    """PLAINTEXT Kafka (no auth) and ClickHouse's ports are bound to 127.0.0.1, not every
    interface (issue 17 item 15)."""
    for name in ("kafka", "clickhouse"):
        for p in SERVICES[name]["ports"]:
            assert str(p).startswith("127.0.0.1:"), (name, p)


def test_grafana_reads_keep_firing_for_and_the_rules_links_are_absolute() -> None:
    """File provisioning reads keepFiringFor from Grafana 12.1.2 (grafana#109710) and keeps a
    rule's annotations as written: no ${...} may be left in them (it would stay literal)."""
    version = SERVICES["grafana"]["image"].split(":")[1]
    assert tuple(int(x) for x in version.split(".")) >= (12, 1, 2), version
    rules = yaml.safe_load((REPO / "deploy/grafana/provisioning/alerting/argus.yaml").read_text())
    for rule in rules["groups"][0]["rules"]:
        text = yaml.safe_dump(rule["annotations"])
        assert "${" not in text, rule["uid"]
        assert rule["annotations"]["runbook_url"].startswith("https://")
        assert "http://localhost:3000/d/" in rule["annotations"]["dashboard_url"]
        assert "keepFiringFor" in rule
    assert "ARGUS_ALERT_WEBHOOK_URL" in SERVICES["grafana"]["environment"]
