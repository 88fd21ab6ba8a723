"""``argus worker``: one stream worker process (run more for scale-out)."""

from __future__ import annotations

import typer

from ._app import EXIT_UNAVAILABLE, app, console, fail, settings


@app.command()
def worker(
    app_id: str = typer.Option("argus-streams", help="Faust app id (the consumer group)"),
    metrics_port: int = typer.Option(0, help="serve Prometheus /metrics on this port (0: off)"),
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

        def snapshot() -> dict[str, object]:
            p50, p99 = metrics.completion_quantiles()
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
                    "gauge",
                    "first part in to findings out",
                    {(("quantile", "0.5"),): p50, (("quantile", "0.99"),): p99},
                ),
            }

        serve_metrics(metrics_port, snapshot)  # type: ignore[arg-type]
    console.print(
        f"worker {app_id}: {s.kafka_bootstrap}, {s.kafka_partitions} partitions, store {s.streams_store}"
    )
    faust.Worker(faust_app, loglevel=loglevel, quiet=True).execute_from_commandline()
