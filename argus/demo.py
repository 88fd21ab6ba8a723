"""``argus demo``: records through the real broker into ClickHouse, and what comes back."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas import ALL_TOPICS, STEPS, StepBatch, step_key

from .config import Settings
from .kafka_admin import ensure_topics, probe_kafka

__all__ = ["DemoResult", "run_foundation_demo", "synthetic_steps"]


@dataclass(frozen=True)
class DemoResult:
    """What the demo sent and what it read back."""

    job: str
    sent_rows: int
    stored_rows: int
    slowest: list[tuple[Any, ...]]
    seconds: float


def synthetic_steps(job: str, ranks: int, steps: int, *, slow_rank: int, seed: int = 0) -> list[StepBatch]:
    """A small job with one slow rank, one batch per host (8 ranks) per step."""
    rng = np.random.default_rng(seed)
    t0 = time.time_ns()
    out: list[StepBatch] = []
    for step in range(steps):
        cols = StepBatch.empty_columns(ranks)
        cols["rank"][:] = np.arange(ranks)
        cols["host"][:] = [f"node{r // 8:03d}" for r in range(ranks)]
        cols["dp"][:] = np.arange(ranks)
        fwd = rng.normal(30.0, 0.5, ranks)
        fwd[slow_rank] *= 1.5
        cols["forward_ms"][:] = fwd
        cols["backward_ms"][:] = 2 * fwd
        cols["optimizer_ms"][:] = 5.0
        cols["all_reduce_ms"][:] = fwd.max() * 3 - 3 * fwd + 10.0
        step_ms = 3 * fwd + 5.0 + cols["all_reduce_ms"]
        start = t0 + int(step * 200e6)
        cols["start_ns"][:] = start
        cols["end_ns"][:] = start + (step_ms * 1e6).astype(np.int64)
        cols["samples"][:] = 32
        full = StepBatch(job, 0, step, cols)
        out.extend(full.take(np.arange(h, min(h + 8, ranks))) for h in range(0, ranks, 8))
    return out


def run_foundation_demo(
    settings: Settings, *, ranks: int = 64, steps: int = 50, timeout_s: float = 90.0
) -> DemoResult:
    """Publish a synthetic job, sink it into ClickHouse, read it back."""
    from producers.publisher import Publisher
    from sinks import migrate
    from sinks.kafka_sink import KafkaSink

    from .wiring import open_configured_store

    begin = time.monotonic()
    conf = settings.kafka_client_config()
    probe_kafka(conf)
    ensure_topics(conf, ALL_TOPICS, partitions=settings.kafka_partitions)
    job = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    batches = synthetic_steps(job, ranks, steps, slow_rank=ranks // 3)
    publisher = Publisher(conf)
    for b in batches:
        publisher.publish(STEPS, step_key(job, b.step), b)
    left = publisher.flush(30)
    if left:
        raise RuntimeError(f"{left} records were not delivered to Kafka")
    sent = sum(len(b) for b in batches)

    store = open_configured_store(settings)
    migrate(store, ttl_days=settings.ttl_days)
    sink = KafkaSink(lambda: store, conf, batch_seconds=0.3)
    stored = 0
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and stored < sent:
            sink.poll(0.5)
            stored = store.query_rows("SELECT count() FROM steps WHERE job = {job:String}", {"job": job})[0][
                0
            ]
        slowest = store.query_rows(
            "SELECT rank, any(host), count() AS steps, round(median(step_ms), 1) AS step_ms, "
            "round(median(forward_ms), 1) AS forward_ms, round(median(all_reduce_ms), 1) AS all_reduce_ms "
            "FROM steps WHERE job = {job:String} GROUP BY rank ORDER BY forward_ms DESC LIMIT 5",
            {"job": job},
        )
    finally:
        sink.close()
    return DemoResult(job, sent, stored, slowest, time.monotonic() - begin)
