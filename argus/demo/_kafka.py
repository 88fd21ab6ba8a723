"""The demo's view of Kafka: consumer groups' lag and a monitor of the worker's output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from argus.schemas import (
    ANOMALIES,
    STEP_FINDINGS,
    STEP_SUMMARIES,
    Anomaly,
    SchemaError,
    StepSummary,
    decode,
    job_key,
)

from ..kafka_admin import end_offsets

__all__ = ["_Monitor", "_consumer", "_lagging"]


def _consumer(conf: dict[str, Any], group: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer({**conf, "group.id": group, "enable.auto.commit": False, "log_level": 3})


def _lagging(conf: dict[str, Any], group: str, targets: dict[tuple[str, int], int]) -> int:
    """How many of ``targets`` the group's committed offsets have not reached yet."""
    from confluent_kafka import TopicPartition

    if not targets:
        return 0
    c = _consumer(conf, group)
    try:
        got = c.committed([TopicPartition(t, p) for t, p in targets], timeout=10)
    finally:
        c.close()
    return sum(1 for tp in got if tp.offset < targets[(tp.topic, tp.partition)])


class _Monitor:
    """Reads the worker's output for the demo's jobs, from the topics' ends at creation."""

    def __init__(self, conf: dict[str, Any], jobs: Sequence[str]) -> None:
        from confluent_kafka import TopicPartition

        self._keys = {job_key(j): j for j in jobs}
        self.steps: dict[str, set[int]] = {j: set() for j in jobs}
        self.findings: dict[str, int] = dict.fromkeys(jobs, 0)
        self.findings_end: dict[tuple[str, int], int] = {}
        self.anomalies: dict[str, Anomaly] = {}
        self.position: dict[tuple[str, int], int] = {}
        ends = end_offsets(conf, [STEP_SUMMARIES, STEP_FINDINGS, ANOMALIES])
        self._c = _consumer(conf, "argus-demo-monitor")
        self._c.assign([TopicPartition(t, p, o) for (t, p), o in ends.items()])
        self.position.update(ends)

    def poll(self, seconds: float = 0.3) -> None:
        """Consume what arrived within ``seconds``."""
        for m in self._c.consume(1000, timeout=seconds):
            if m.error():
                continue
            topic, partition, offset = m.topic(), m.partition(), m.offset()
            self.position[(topic, partition)] = offset + 1
            job = self._keys.get(m.key() or b"")
            if job is None:
                continue
            if topic == STEP_FINDINGS:
                self.findings[job] += 1
                self.findings_end[(topic, partition)] = offset + 1
                continue
            try:
                rec = decode(m.value())
            except SchemaError:
                continue
            if isinstance(rec, StepSummary):
                self.steps[job].add(rec.step)
            elif isinstance(rec, Anomaly):
                self.anomalies[rec.id] = rec

    def reached(self, targets: dict[tuple[str, int], int]) -> bool:
        """Whether this monitor has read up to ``targets``."""
        return all(self.position.get(tp, 0) >= o for tp, o in targets.items())

    def close(self) -> None:
        self._c.close()
