"""Shared fixtures: the real Kafka broker (started once if it is not running) and a chDB store.

chDB allows one data directory per process, so the store is session-scoped; tests isolate
themselves with unique job ids and topic names instead of fresh directories.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
BOOTSTRAP = os.environ.get("ARGUS_KAFKA_BOOTSTRAP", f"127.0.0.1:{os.environ.get('ARGUS_KAFKA_PORT', '9092')}")


@pytest.fixture(scope="session")
def kafka_conf() -> dict[str, Any]:
    """librdkafka settings of a running broker; starts the project's broker if none answers."""
    from argus.kafka_admin import KafkaUnavailable, probe_kafka

    conf = {"bootstrap.servers": BOOTSTRAP}
    try:
        probe_kafka(conf, timeout=3)
    except KafkaUnavailable:
        subprocess.run([str(REPO / "scripts" / "kafka.sh"), "up"], check=True, timeout=300)
        probe_kafka(conf, timeout=30)
    return conf


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A migrated embedded ClickHouse store for the whole test session."""
    from argus.sinks import ChdbStore, migrate

    s = ChdbStore(tmp_path_factory.mktemp("clickhouse"))
    migrate(s)
    yield s
    s.close()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for job ids, topics and consumer groups."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def worker_factory(kafka_conf: dict[str, Any], tmp_path: Path) -> Iterator[Any]:
    """Start `argus worker` subprocesses (``start(app_id, *args)``); all stopped after the test."""
    from argus.kafka_admin import ensure_topics
    from argus.schemas import ALL_TOPICS
    from tests.workers import Worker

    ensure_topics(kafka_conf, ALL_TOPICS, partitions=16)
    started: list[Worker] = []

    def start(app_id: str, *args: str) -> Worker:
        w = Worker(app_id, tmp_path, kafka_conf["bootstrap.servers"], *args)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()
