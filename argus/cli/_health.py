"""Kubelet probes next to ``/metrics``: ``/livez`` and ``/readyz`` answer 200 or 503 with the reason.

The probes share the metrics server (one port per pod, the chart's ``metrics`` port): the
server :func:`argus.metrics.serve_metrics` started is a :mod:`wsgiref` server, whose
application is wrapped so the probe paths are answered first::

    server = serve_metrics(port, snapshot)
    add_probes(server, {"/livez": sink.liveness, "/readyz": sink.readiness})
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["Probe", "add_probes"]

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
