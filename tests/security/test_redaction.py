"""Secrets never printed (issue 17 item 11): URL passwords redacted in `argus doctor`,
`argus sink`, errors and logs; a doctor with nothing reachable prints one line per part."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from argus.config import redact_url

SECRET = "S3cretPW-do-not-print"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://argus:S3cretPW@ch:8123", "http://argus:***@ch:8123"),
        ("at https://u:p%40ss@h/db?x=1 and http://h2", "at https://u:***@h/db?x=1 and http://h2"),
        ("clickhouse://:pw@h:9000", "clickhouse://:***@h:9000"),
        ("http://h:8123/?user=a&password=pw&db=x", "http://h:8123/?user=a&password=***&db=x"),
        ("http://h/?token=glsa_1", "http://h/?token=***"),
        ("http://user@h:8123 (no password)", "http://user@h:8123 (no password)"),
    ],
)
def test_redact_url(text: str, shown: str) -> None:
    assert redact_url(text) == shown


def _run(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "argus.cli", *args],
        env={**os.environ, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_doctor_hides_the_password_and_prints_one_line_per_part(tmp_path: Path) -> None:
    """Nothing reachable (before: the password shown, and 97 lines of rdkafka "Connection
    refused")."""
    done = _run(
        "doctor",
        env={
            "ARGUS_HOME": str(tmp_path),
            "ARGUS_KAFKA_BOOTSTRAP": "127.0.0.1:1",
            "ARGUS_CLICKHOUSE_URL": f"http://argus:{SECRET}@127.0.0.1:2",
        },
    )
    out = done.stdout + done.stderr
    assert done.returncode == 3
    assert SECRET not in out
    assert "http://argus:***@127.0.0.1:2" in out
    assert "rdkafka" not in out and "urllib3" not in out
    rows = [ln for ln in out.splitlines() if ln.startswith("│")]
    assert len(rows) == len([ln for ln in rows if ln.startswith("│ ") and not ln.startswith("│  ")])
    kafka = [ln for ln in rows if ln.startswith("│ Kafka ")]
    clickhouse = [ln for ln in rows if ln.startswith("│ ClickHouse ")]
    assert len(kafka) == 1 and "FAIL" in kafka[0]
    assert len(clickhouse) == 1 and "Connection refused" in clickhouse[0]
    assert len(out.splitlines()) < 25


@pytest.mark.kafka
def test_sink_hides_the_password_in_its_errors_and_logs(kafka_conf, tmp_path: Path) -> None:
    done = _run(
        "-v",
        "sink",
        "--idle-exit",
        "1",
        env={
            "ARGUS_HOME": str(tmp_path),
            "ARGUS_KAFKA_BOOTSTRAP": kafka_conf["bootstrap.servers"],
            "ARGUS_CLICKHOUSE_URL": f"http://argus:{SECRET}@127.0.0.1:2",
        },
    )
    assert done.returncode == 3
    assert SECRET not in done.stdout + done.stderr


def test_log_lines_never_show_a_url_password() -> None:
    code = (
        "import logging; from argus.cli._app import setup_logging; setup_logging(False); "
        f"logging.getLogger('x').warning('cannot reach %s', 'http://a:{SECRET}@h:1')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "http://a:***@h:1" in done.stderr and SECRET not in done.stderr


def test_grafana_push_takes_no_token_on_the_command_line(tmp_path: Path) -> None:
    """A --token would be visible to every user in `ps`: env or file only."""
    done = _run(
        "grafana",
        "push",
        "--url",
        "http://127.0.0.1:1",
        "--token",
        "glsa_x",
        env={"ARGUS_HOME": str(tmp_path)},
    )
    assert done.returncode == 2 and "No such option" in done.stderr
    done = _run("grafana", "push", "--url", "http://127.0.0.1:1", env={"ARGUS_HOME": str(tmp_path)})
    assert done.returncode == 2 and "ARGUS_GRAFANA_TOKEN_FILE" in done.stderr
