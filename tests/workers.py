"""The stream worker as users run it (`argus worker` subprocesses) and what tests do around
it: publish a simulated job, start a fresh consumer group, collect its anomalies. The
``worker_factory`` fixture (tests/conftest.py) starts workers and stops them after a test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from argus.kafka_admin import read_records, skip_worker_to_end
from argus.producers.publisher import Publisher
from argus.schemas import (
    ANOMALIES,
    HEARTBEATS,
    STEP_FINDINGS,
    STEP_SUMMARIES,
    STEPS,
    Anomaly,
)
from argus.simulate import layout_for, parse_fault, publish_simulation

__all__ = ["WORKER_TOPICS", "Worker", "collect", "fresh_group", "publish"]


class Worker:
    """An `argus worker` subprocess."""

    def __init__(self, app_id: str, home: Path, bootstrap: str, *args: str) -> None:
        env = {**os.environ, "ARGUS_HOME": str(home), "ARGUS_KAFKA_BOOTSTRAP": bootstrap}
        self.log = open(home / f"{app_id}-{time.time_ns()}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "argus.cli", "worker", "--app-id", app_id, *args],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


WORKER_TOPICS = [STEPS, STEP_FINDINGS, HEARTBEATS]


def fresh_group(kafka_conf, app_id: str) -> str:
    """A worker app id whose consumer groups start at the end of their inputs (not their
    history): a worker reads kernels, stacks and an internal topic too, and their history
    (other tests', benches', demos') would be its first load."""
    skip_worker_to_end(kafka_conf, app_id)
    return app_id


def publish(kafka_conf, job: str, steps: int, faults: list[str], *, ranks: int = 256, rate: float = 0.0):
    layout = layout_for(ranks)
    publisher = Publisher(kafka_conf)
    result = publish_simulation(
        publisher.publish,
        job=job,
        layout=layout,
        steps=steps,
        faults=[parse_fault(f, layout) for f in faults],
        rate=rate,
        seed=7,
    )
    assert publisher.flush(30) == 0
    return layout, result


def collect(kafka_conf, job: str, *, until, timeout: float = 120.0) -> tuple[dict[str, Anomaly], set[int]]:
    """Anomalies (latest version per id) and summarized steps of ``job`` until ``until`` holds."""
    anomalies: dict[str, Anomaly] = {}
    steps: set[int] = set()

    def take(topic: str, r: Any) -> None:
        if r.job != job:
            return
        if topic == ANOMALIES:
            anomalies[r.id] = r
        else:
            steps.add(r.step)

    read_records(
        kafka_conf, [ANOMALIES, STEP_SUMMARIES], take, until=lambda: until(anomalies, steps), timeout=timeout
    )
    return anomalies, steps
