"""`argus node-agent --metrics-port`: Prometheus metrics and a /healthz that checks the relay (real process)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.kafka
def test_node_agent_serves_relay_metrics_and_health(kafka_conf, tmp_path: Path) -> None:
    port = _free_port()
    sock = tmp_path / "relay.sock"
    env = {
        **os.environ,
        "ARGUS_HOME": str(tmp_path),
        "ARGUS_KAFKA_BOOTSTRAP": kafka_conf["bootstrap.servers"],
        "ARGUS_METRICS_ADDR": "127.0.0.1",
    }
    args = [
        sys.executable,
        "-m",
        "argus.cli",
        "node-agent",
        "--relay",
        str(sock),
        "--metrics-port",
        str(port),
    ]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        status = 0
        while time.monotonic() < deadline:
            try:
                status, body = _get(f"http://127.0.0.1:{port}/healthz")
                break
            except OSError:
                time.sleep(0.3)
        assert (status, body.strip()) == (200, "ok")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:  # garbage: refused, counted
            s.sendto(b"not a step record", str(sock))
        time.sleep(1.0)
        status, text = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert "argus_relay_received_total" in text and "argus_node_publisher_dropped_total" in text
        refused = [ln for ln in text.splitlines() if ln.startswith("argus_relay_refused_total{")]
        forwarded = "argus_relay_received_total 1.0" in text
        assert refused or forwarded, text
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 or "GPU health absent" in out, out
