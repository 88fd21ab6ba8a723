"""``argus sink``: the one writer of the ClickHouse store."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

import typer

from ..config import redact_url
from ._app import app, console, exit_on_error, settings

log = logging.getLogger("argus.sink")


@app.command()
def sink(
    group: str = typer.Option("argus-sink", help="Kafka consumer group"),
    batch_rows: int = typer.Option(5000, min=1, help="rows per insert (or --batch-seconds, whichever first)"),
    batch_seconds: float = typer.Option(1.0, min=0.05, help="seconds per insert at most"),
    metrics_port: int = typer.Option(
        0, help="serve Prometheus /metrics and the kubelet's /livez and /readyz on this port (0: off)"
    ),
    idle_exit: float = typer.Option(0.0, help="exit after this many idle seconds (0: run until SIGTERM)"),
) -> None:
    """Consume the Argus topics into ClickHouse, exactly once; stop cleanly on SIGTERM/SIGINT."""
    from argus.schemas import ALL_TOPICS
    from argus.sinks import migrate
    from argus.sinks.kafka_sink import KafkaSink
    from argus.sinks.migrate import retention_report

    from ..kafka_admin import ensure_topics, probe_kafka
    from ..wiring import open_configured_store

    s = settings()
    conf = s.kafka_client_config()
    with exit_on_error():
        probe_kafka(conf)
        ensure_topics(conf, ALL_TOPICS, partitions=s.kafka_partitions)
        store = open_configured_store(s)
        migrate(store, ttl_days=s.ttl_days)
        console.print(retention_report(store, s.ttl_days), markup=False, highlight=False)

    first = [store]

    def open_store() -> Any:  # the first open is the one above; reopen after failures
        return first.pop() if first else open_configured_store(s)

    worker = KafkaSink(open_store, conf, group=group, batch_rows=batch_rows, batch_seconds=batch_seconds)
    worker.store_answered()  # the migrations above ran on it
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if metrics_port:
        from ..metrics import serve_metrics

        def snapshot() -> dict[str, Any]:
            st = worker.stats
            return {
                "argus_sink_messages_total": ("counter", "Kafka messages consumed", {(): st.messages}),
                "argus_sink_rows_total": (
                    "counter",
                    "rows inserted",
                    {(("table", t),): n for t, n in st.rows.items()},
                ),
                "argus_sink_dead_letters_total": (
                    "counter",
                    "bad messages stored as dead letters",
                    {(): st.dead_letters},
                ),
                "argus_sink_insert_retries_total": ("counter", "inserts retried", {(): st.insert_retries}),
                "argus_sink_store_down": (
                    "gauge",
                    "1 while ClickHouse refuses inserts",
                    {(): float(st.store_down_since is not None)},
                ),
            }

        from ._health import add_probes

        server = serve_metrics(metrics_port, snapshot, addr=s.metrics_addr)
        add_probes(server, {"/livez": worker.liveness, "/readyz": worker.readiness})
    where = redact_url(s.clickhouse_url) or str(s.data_dir)
    console.print(f"sink: {s.kafka_bootstrap} → ClickHouse {where} (group {group}); Ctrl-C to stop")
    started = time.monotonic()
    stats = worker.run(stop, idle_exit_s=idle_exit or None)
    rows = sum(stats.rows.values())
    console.print(
        f"sink: stopped after {time.monotonic() - started:.1f} s: {stats.messages} messages, {rows} rows "
        f"({', '.join(f'{t} {n}' for t, n in sorted(stats.rows.items())) or 'none'}), "
        f"{stats.dead_letters} dead letters, {stats.insert_retries} insert retries",
        soft_wrap=True,  # one line in a log, however long
    )
