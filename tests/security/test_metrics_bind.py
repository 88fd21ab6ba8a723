"""/metrics binds the configured address, this machine only by default (issue 17 item 15;
before: always 0.0.0.0)."""

from __future__ import annotations

import pytest

from argus.metrics import serve_metrics


def _snapshot() -> dict:
    return {"argus_test_total": ("counter", "a test", {(): 1.0})}


def test_metrics_bind_loopback_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARGUS_METRICS_ADDR", raising=False)
    server = serve_metrics(0, _snapshot)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_bind_the_address_of_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARGUS_METRICS_ADDR", "127.0.0.2")
    server = serve_metrics(0, _snapshot)
    try:
        assert server.server_address[0] == "127.0.0.2"
    finally:
        server.shutdown()
        server.server_close()
