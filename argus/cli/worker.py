"""``argus worker``: one stream worker process (run more for scale-out)."""

from __future__ import annotations

import contextlib
import time

import typer

from ._app import app, console, exit_on_error, one_line_records, settings

__all__: list[str] = []


def _logging(loglevel: str) -> dict[str, object]:
    """Faust's logging setup, plus the jobs' progress lines at INFO unless errors only were asked."""
    if loglevel.lower() not in ("warn", "warning", "info", "debug"):
        return {"merge": True}
    progress = {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"}
    return {
        "merge": True,
        "handlers": {"progress": {**progress, "level": "INFO"}},
        "loggers": {
            "argus.streams.progress": {"level": "INFO", "handlers": ["progress"], "propagate": False}
        },
    }


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

    from argus.schemas import STEP_FINDINGS
    from argus.streams import build_app
    from argus.streams.app import WORKER_TOPICS, consumer_groups, own_topics
    from argus.streams.metrics import summary

    from ..kafka_admin import ensure_topics, probe_kafka, topic_partitions
    from ..wiring import stream_config

    s = settings()
    conf = s.kafka_client_config()
    with exit_on_error():
        probe_kafka(conf)
        replicas = s.streams_replication_factor  # 0: the brokers' default
        ensure_topics(conf, list(WORKER_TOPICS), partitions=s.kafka_partitions, replication_factor=replicas)
        # The job-state table is co-partitioned with the findings topic: take what exists.
        partitions = topic_partitions(conf, STEP_FINDINGS)
        faust_app, metrics = build_app(stream_config(s, app_id=app_id, partitions=partitions))
        # Faust declares its tables' changelog topics itself but does not wait for them: a
        # table written before the broker's metadata shows the new topic stops its agent
        # (PartitionsMismatch); and it would create them with a fixed replication factor.
        # Create them here (compacted as Faust would), and the internal topic, and wait.
        for topic, config in own_topics(faust_app):
            ensure_topics(conf, [topic], partitions=partitions, config=config, replication_factor=replicas)
    if metrics_port:
        from argus.streams.metrics import Family, metric_families

        from ..kafka_admin import GroupLag
        from ..metrics import serve_metrics
        from ._health import WorkerHealth, add_probes

        lag_of = [GroupLag(conf, group, list(topics)) for group, topics in consumer_groups(app_id).items()]

        def snapshot() -> dict[str, Family]:
            lags: dict[str, int] = {}
            for lag in lag_of:
                with contextlib.suppress(Exception):  # the broker is away: no lag figure this scrape
                    lags.update(lag())
            return metric_families(metrics, lags)

        server = serve_metrics(metrics_port, snapshot)
        health = WorkerHealth(faust_app)  # the kubelet's /livez and /readyz beside /metrics
        add_probes(server, {"/livez": health.liveness, "/readyz": health.readiness})
    console.print(
        f"worker {app_id}: {s.kafka_bootstrap}, {s.kafka_partitions} partitions, store {s.streams_store}"
    )
    one_line_records()  # job names come from the agents: none may forge a worker log line
    worker = faust.Worker(faust_app, loglevel=loglevel, quiet=True, logging_config=_logging(loglevel))
    if not worker.stdout.isatty():
        worker.spinner = None  # its cursor codes would land in a log file
    started = time.monotonic()
    try:
        worker.execute_from_commandline()
    finally:
        console.print(  # one line in a log, however long
            f"worker {app_id}: stopped after {time.monotonic() - started:.1f} s: {summary(metrics)}",
            soft_wrap=True,
            markup=False,  # the counts are data, not rich markup
        )
