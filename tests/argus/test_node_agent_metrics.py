"""`argus node-agent --metrics-port`: Prometheus metrics and a /healthz that checks the relay (real process)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.net import free_port, http_get


@pytest.mark.kafka
def test_node_agent_serves_relay_metrics_and_health(kafka_conf, tmp_path: Path) -> None:
    port = free_port()
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
                status, body = http_get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.3)
        assert (status, body.strip()) == (200, "ok")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:  # garbage: refused, counted
            s.sendto(b"not a step record", str(sock))
        time.sleep(1.0)
        status, text = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)
        assert status == 200
        assert "argus_relay_received_total" in text and "argus_node_publisher_dropped_total" in text
        refused = [ln for ln in text.splitlines() if ln.startswith("argus_relay_refused_total{")]
        forwarded = "argus_relay_received_total 1.0" in text
        assert refused or forwarded, text
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 or "GPU health absent" in out, out
