"""``argus worker``: one stream worker process (run more for scale-out)."""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Iterable

import typer

from ._app import EXIT_UNAVAILABLE, app, console, fail, settings

__all__ = ["LATENCY_BUCKETS_S", "LatencyHistogram"]

LATENCY_BUCKETS_S = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, float("inf"))
"""Bucket bounds of ``argus_worker_step_completion_seconds`` (first part in to findings out)."""


class LatencyHistogram(deque[float]):
    """The worker's completion-latency deque that also keeps a cumulative Prometheus histogram.

    It replaces ``StreamMetrics.completion_s`` (same bounded deque for the quantiles the worker
    already logs), so every ``append`` is counted once in the buckets, whatever the deque drops.
    """

    def __init__(self, values: Iterable[float] = (), maxlen: int | None = None) -> None:
        super().__init__(maxlen=maxlen)
        self._lock = threading.Lock()
        self.counts = [0] * len(LATENCY_BUCKETS_S)
        self.total = 0.0
        for v in values:
            self.append(v)

    def append(self, value: float) -> None:
        with self._lock:
            super().append(value)
            self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, value)] += 1
            self.total += value

    def buckets(self) -> tuple[list[tuple[float, int]], float]:
        """Cumulative ``(upper bound, count)`` pairs ending with +inf, and the sum of seconds."""
        with self._lock:
            out, running = [], 0
            for le, n in zip(LATENCY_BUCKETS_S, self.counts, strict=True):
                running += n
                out.append((le, running))
            return out, self.total


@app.command()
def worker(
    app_id: str = typer.Option("argus-streams", help="Faust app id (the consumer group)"),
    metrics_port: int = typer.Option(
        0, help="serve Prometheus /metrics, /livez and /readyz on this port (0: off)"
    ),
    loglevel: str = typer.Option("warn", help="crit, error, warn, info or debug"),
) -> None:
    """Run a stream worker: assemble steps, diagnose them live, publish anomalies (SIGTERM stops it)."""
    import faust

    from argus.schemas import ANOMALIES, DEAD_LETTER, HEARTBEATS, STEP_FINDINGS, STEP_SUMMARIES, STEPS
    from argus.streams import build_app

    from ..kafka_admin import KafkaUnavailable, ensure_topics, probe_kafka, topic_partitions
    from ..wiring import stream_config

    s = settings()
    conf = s.kafka_client_config()
    try:
        probe_kafka(conf)
        ensure_topics(
            conf,
            [STEPS, STEP_FINDINGS, STEP_SUMMARIES, ANOMALIES, DEAD_LETTER, HEARTBEATS],
            partitions=s.kafka_partitions,
        )
        # The job-state table is co-partitioned with the findings topic: take what exists.
        partitions = topic_partitions(conf, STEP_FINDINGS)
        faust_app, metrics = build_app(stream_config(s, app_id=app_id, partitions=partitions))
        # Faust declares its tables' changelog topics itself but does not wait for them: a
        # table written before the broker's metadata shows the new topic stops its agent
        # (PartitionsMismatch). Create them here, compacted as Faust would, and wait.
        ensure_topics(
            conf,
            [table.changelog_topic.get_topic_name() for table in faust_app.tables.values()],
            partitions=partitions,
            config={"cleanup.policy": "compact"},
        )
    except KafkaUnavailable as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    if metrics_port:
        from ..kafka_admin import GroupLag
        from ..metrics import serve_metrics

        lag = GroupLag(conf, app_id, [STEPS, STEP_FINDINGS])
        latency = LatencyHistogram(metrics.completion_s, maxlen=metrics.completion_s.maxlen)
        metrics.completion_s = latency  # the stream appends here; the histogram counts each append

        def snapshot() -> dict[str, object]:
            try:
                lags = lag()
            except Exception:  # the broker is away: no lag figure this scrape
                lags = {}
            return {
                "argus_worker_consumer_lag": (
                    "gauge",
                    "messages not yet processed, per topic",
                    {(("topic", t),): v for t, v in lags.items()},
                ),
                "argus_worker_records_total": (
                    "counter",
                    "rank-step records consumed",
                    {(): metrics.records},
                ),
                "argus_worker_messages_total": ("counter", "Kafka messages consumed", {(): metrics.messages}),
                "argus_worker_steps_total": (
                    "counter",
                    "steps completed, by how",
                    {(("reason", k),): v for k, v in metrics.steps.items()},
                ),
                "argus_worker_anomalies_total": (
                    "counter",
                    "anomalies published, by root cause",
                    {(("cause", k),): v for k, v in metrics.anomalies.items()},
                ),
                "argus_worker_dead_letters_total": (
                    "counter",
                    "bad messages sent to the dead-letter topic",
                    {(("reason", k),): v for k, v in metrics.dead_letters.items()},
                ),
                "argus_worker_open_steps": ("gauge", "steps waiting for ranks", {(): metrics.open_steps}),
                "argus_worker_step_completion_seconds": (
                    "histogram",
                    "first part of a step in to its findings out, seconds",
                    {(): latency.buckets()},
                ),
            }

        from ._health import WorkerHealth, add_probes

        server = serve_metrics(metrics_port, snapshot)  # type: ignore[arg-type]
        health = WorkerHealth(faust_app)  # the kubelet's /livez and /readyz beside /metrics
        add_probes(server, {"/livez": health.liveness, "/readyz": health.readiness})
    console.print(
        f"worker {app_id}: {s.kafka_bootstrap}, {s.kafka_partitions} partitions, store {s.streams_store}"
    )
    worker = faust.Worker(faust_app, loglevel=loglevel, quiet=True)
    if not worker.stdout.isatty():
        worker.spinner = None  # its cursor codes would land in a log file
    worker.execute_from_commandline()
