"""Docs per reader stay true to the code; one version everywhere; the license is declared."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from argus.detectors import DECIDING_FIGURE
from argus.schemas.causes import FAULT_CAUSES, HANG_CAUSES, UNKNOWN
from argus.sinks.grafana import ALERTS

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]


def test_readme_is_short_and_links_every_reader_document() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024
    for doc in ("operations", "on-call", "sql", "agent", "benchmarks"):
        assert (REPO / "docs" / f"{doc}.md").is_file()
        assert f"(docs/{doc}.md)" in readme
    assert "rocksdb" not in readme.lower()


def test_on_call_covers_every_alert_and_every_root_cause_with_its_deciding_key() -> None:
    text = (REPO / "docs" / "on-call.md").read_text()
    sections = dict(re.findall(r"^### (\S+)[^\n]*\n(.*?)(?=^##|\Z)", text, re.M | re.S))
    for rule in ALERTS:
        assert f"(`{rule.uid}`)" in text, rule.uid
    for cause in (*FAULT_CAUSES, UNKNOWN, *HANG_CAUSES):
        body = sections.get(cause)
        assert body, f"no section for {cause}"
        assert "**Means**" in body and "**Deciding evidence**" in body and "**Do**" in body, cause
        if cause in DECIDING_FIGURE:
            assert f"`{DECIDING_FIGURE[cause]}`" in body, (cause, DECIDING_FIGURE[cause])


def test_one_version_in_package_chart_compose_and_dockerfile() -> None:
    chart = yaml.safe_load((REPO / "helm/argus/Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION, "run `make version-sync`"
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    images = {s.get("image") for s in compose["services"].values()}
    assert f"argus:{VERSION}" in images and not {i for i in images if i and i.startswith("argus:")} - {
        f"argus:{VERSION}"
    }
    assert f"docker build -t argus:{VERSION} ." in (REPO / "Dockerfile").read_text()


def test_license_is_apache_2_as_an_spdx_expression() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert "LICENSE" in PYPROJECT["project"]["license-files"]
    head = (REPO / "LICENSE").read_text().splitlines()[:2]
    assert "Apache License" in head[0] and "Version 2.0, January 2004" in head[1]
    assert ">=77" in PYPROJECT["build-system"]["requires"][0]  # setuptools that reads SPDX strings
