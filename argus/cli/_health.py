"""Kubelet probes next to ``/metrics``: ``/livez`` and ``/readyz`` answer 200 or 503 with the reason.

The probes share the metrics server (one port per pod, the chart's ``metrics`` port): the
server :func:`argus.metrics.serve_metrics` started is a :mod:`wsgiref` server, whose
application is wrapped so the probe paths are answered first::

    server = serve_metrics(port, snapshot)
    add_probes(server, {"/livez": sink.liveness, "/readyz": sink.readiness})

:class:`WorkerHealth` gives a Faust stream worker the same two checks from outside its app
module: the app's own partition signals and a timer on its event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["Probe", "WorkerHealth", "add_probes"]

Probe = Callable[[], tuple[bool, str]]
"""A check: (healthy, one line saying why)."""


def add_probes(server: Any, probes: Mapping[str, Probe]) -> None:
    """Answer ``probes``' paths on ``server`` (a :class:`wsgiref.simple_server.WSGIServer`):
    200 when the check passes, 503 when it fails or raises; every other path as before."""
    inner = server.get_app()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        probe = probes.get(environ.get("PATH_INFO", ""))
        if probe is None:
            return inner(environ, start_response)  # type: ignore[no-any-return]
        try:
            ok, why = probe()
        except Exception as exc:  # a probe that cannot tell is a failing probe, not a 500
            ok, why = False, f"probe failed: {type(exc).__name__}: {exc}"
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
        return [why.encode() + b"\n"]

    server.set_app(app)


class WorkerHealth:
    """Readiness and liveness of a Faust worker, read from the app it runs.

    - ready: the consumer has its partition assignment (possibly none: more workers than
      partitions), no rebalance or table recovery is in progress, and the event loop ticks;
    - live: the event loop ran a timer within ``stall_s`` (an agent blocking the loop, or a
      consumer that stopped, stops the ticks).

    Create it before the worker starts: it connects to the app's partition signals and adds
    a timer of ``tick_s``.
    """

    def __init__(self, faust_app: Any, *, stall_s: float = 60.0, tick_s: float = 5.0) -> None:
        if stall_s <= tick_s:
            raise ValueError("stall_s must be longer than tick_s")
        self._app = faust_app
        self._stall_s = stall_s
        self._assigned: int | None = None  # partitions held; None: no assignment yet
        self._tick: float | None = None
        faust_app.on_partitions_assigned.connect(self._on_assigned)
        faust_app.on_partitions_revoked.connect(self._on_revoked)
        faust_app.timer(interval=tick_s)(self._on_tick)

    async def _on_assigned(self, sender: Any, assigned: Any, **_: Any) -> None:
        self._assigned = len(assigned)
        self._tick = time.monotonic()

    async def _on_revoked(self, sender: Any, revoked: Any, **_: Any) -> None:
        self._assigned = None

    async def _on_tick(self) -> None:
        self._tick = time.monotonic()

    def readiness(self, now: float | None = None) -> tuple[bool, str]:
        """(ready, why): assigned, not rebalancing or recovering tables, the loop ticking."""
        now = time.monotonic() if now is None else now
        if self._assigned is None:
            return False, "no partition assignment yet (joining the consumer group)"
        if getattr(self._app, "rebalancing", False):
            return False, "rebalancing"
        if getattr(self._app, "in_recovery", False):
            return False, "recovering tables from their changelogs"
        live, why = self.liveness(now)
        if not live:
            return False, why
        return True, f"ready: {self._assigned} partition(s) assigned, {why}"

    def liveness(self, now: float | None = None) -> tuple[bool, str]:
        """(live, why): the event loop ran the timer within ``stall_s`` (live while starting)."""
        now = time.monotonic() if now is None else now
        if self._tick is None:
            return True, "starting"
        if now - self._tick > self._stall_s:
            return (
                False,
                f"the event loop has not ticked for {now - self._tick:.0f} s (limit {self._stall_s:.0f} s)",
            )
        return True, f"event loop ticked {now - self._tick:.1f} s ago"
