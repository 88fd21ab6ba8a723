"""argus/cli/_health.py: the probe routes on the metrics server and the Faust worker's checks."""

from __future__ import annotations

import asyncio

import faust
import pytest

from argus.cli._health import WorkerHealth, add_probes
from argus.metrics import serve_metrics
from tests.helpers.net import http_get


def test_probe_paths_answer_200_or_503_and_metrics_stay() -> None:
    state = {"ok": True}

    def broken() -> tuple[bool, str]:
        raise RuntimeError("cannot tell")

    server = serve_metrics(0, lambda: {"argus_x": ("gauge", "x", {(): 1.0})}, addr="127.0.0.1")
    try:
        add_probes(server, {"/readyz": lambda: (state["ok"], "why not"), "/broken": broken})
        base = f"http://127.0.0.1:{server.server_port}"
        assert http_get(f"{base}/readyz") == (200, "why not\n")
        state["ok"] = False
        assert http_get(f"{base}/readyz") == (503, "why not\n")
        assert http_get(f"{base}/broken") == (503, "probe failed: RuntimeError: cannot tell\n")
        status, body = http_get(f"{base}/metrics")
        assert status == 200 and "argus_x 1.0" in body
    finally:
        server.shutdown()


def test_worker_health_follows_assignment_and_the_event_loop_ticks() -> None:
    app = faust.App("health-test", broker="memory://", store="memory://")
    health = WorkerHealth(app, stall_s=10, tick_s=1)
    assert health.liveness() == (True, "starting")
    assert health.readiness() == (False, "no partition assignment yet (joining the consumer group)")

    async def assign() -> None:
        await health._on_assigned(app, {("t", 0), ("t", 1)})

    asyncio.run(assign())
    ready, why = health.readiness()
    assert ready and why.startswith("ready: 2 partition(s) assigned"), why
    app.rebalancing = True
    assert health.readiness() == (False, "rebalancing")
    app.rebalancing = False
    # the loop stopped ticking: neither live nor ready
    assert health._tick is not None
    later = health._tick + 11
    live, why = health.liveness(now=later)
    assert not live and why.startswith("the event loop has not ticked for 11 s")
    assert health.readiness(now=later)[0] is False
    asyncio.run(health._on_tick())
    assert health.liveness()[0]
    asyncio.run(health._on_revoked(app, set()))
    assert health.readiness()[0] is False
    with pytest.raises(ValueError):
        WorkerHealth(app, stall_s=1, tick_s=5)
