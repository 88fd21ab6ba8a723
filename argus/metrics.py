"""A Prometheus ``/metrics`` endpoint fed by a snapshot function (sink and stream workers)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = ["Snapshot", "serve_metrics"]

Snapshot = Callable[[], Mapping[str, tuple[str, str, Mapping[tuple[tuple[str, str], ...], Any]]]]
"""name -> (kind "counter"|"gauge"|"histogram", help, {label pairs: value}); a histogram's value
is ``(cumulative [(upper bound, count), ...] ending with +inf, sum)``."""


def serve_metrics(port: int, snapshot: Snapshot, *, addr: str | None = None) -> Any:
    """Serve ``snapshot()`` as Prometheus metrics on ``addr:port``; returns the server.

    ``addr`` defaults to the ``metrics_addr`` setting (``ARGUS_METRICS_ADDR``, 127.0.0.1:
    this machine only; the Helm chart sets the pod's IP).
    """
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

    class _Collector:
        def collect(self) -> Iterator[Metric]:
            for name, (kind, help_text, series) in snapshot().items():
                labels = sorted({k for key in series for k, _ in key})
                if kind == "histogram":
                    hist = HistogramMetricFamily(name, help_text, labels=labels)
                    for key, (buckets, total) in series.items():
                        values = dict(key)
                        hist.add_metric(
                            [values.get(k, "") for k in labels],
                            [(str(le) if le != float("inf") else "+Inf", n) for le, n in buckets],
                            total,
                        )
                    yield hist
                    continue
                family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                family = family_type(name, help_text, labels=labels)
                for key, value in series.items():
                    values = dict(key)
                    family.add_metric([values.get(k, "") for k in labels], value)
                yield family

    if addr is None:
        from .config import load_settings

        addr = load_settings().metrics_addr
    registry = CollectorRegistry()
    registry.register(_Collector())
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
