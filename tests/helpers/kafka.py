"""Brokers of their own (a secured listener) and the client round trips the security tests share."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def own_broker(data: Path, port: int, **env: str) -> Iterator[None]:
    """A broker of the project's script on ``port`` (PLAINTEXT; its SASL listener on
    ``port + 2``), data in ``data``, configured by ``ARGUS_KAFKA_*`` ``env``; stopped after."""
    full = {
        **os.environ,
        "ARGUS_KAFKA_PORT": str(port),
        "ARGUS_KAFKA_DATA": str(data),
        "ARGUS_KAFKA_HEAP": "384m",
    }
    full.update(env)
    subprocess.run([str(REPO / "scripts" / "kafka.sh"), "up"], env=full, check=True, timeout=180)
    try:
        yield
    finally:
        subprocess.run([str(REPO / "scripts" / "kafka.sh"), "down"], env=full, timeout=60)


def start_offsets(conf: dict[str, Any], topics: list[str]) -> list[Any]:
    """Partitions of ``topics`` positioned at their current end (so only new records are read)."""
    from confluent_kafka import TopicPartition

    from argus.kafka_admin import end_offsets, ensure_topics

    ensure_topics(conf, topics, partitions=16)
    return [TopicPartition(t, p, hi) for (t, p), hi in end_offsets(conf, topics).items()]


def first_value(conf: dict[str, Any], topic: str, group: str, timeout_s: float = 30.0) -> bytes | None:
    """The first record's value a new consumer group reads from ``topic`` (None: none in time)."""
    from confluent_kafka import Consumer

    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    deadline, got = time.monotonic() + timeout_s, None
    while got is None and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got = m.value()
    c.close()
    return got


def faust_send(bootstrap: str, credentials: Any, topic: str, name: str) -> Any:
    """Send one record with a Faust producer using ``credentials``; its record metadata."""
    import faust

    async def send() -> Any:
        app = faust.App(
            f"{name}-{time.time_ns()}",
            broker=f"kafka://{bootstrap}",
            broker_credentials=credentials,
            web_enabled=False,
        )
        await app.producer.start()
        try:
            fut = await app.producer.send(
                topic, key=None, value=b"from faust", partition=None, timestamp=None, headers=None
            )
            return await fut
        finally:
            await app.producer.stop()

    return asyncio.run(asyncio.wait_for(send(), 60))
