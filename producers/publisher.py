"""The Kafka edge of the producers: encode records and hand them to confluent-kafka.

The only module of ``producers`` that imports confluent_kafka. Idempotent and compressed
(lz4); ``publish`` never raises into the caller for broker trouble: a full local queue is
retried briefly, then the record is counted as dropped with the reason.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from schemas import Record, encode

__all__ = ["PublishError", "Publisher"]

log = logging.getLogger("argus.publisher")


class PublishError(Exception):
    """The publisher cannot work at all (bad configuration, fatal client error)."""


class Publisher:
    """Publish Argus records to Kafka."""

    def __init__(self, kafka_config: dict[str, Any], *, linger_ms: int = 20) -> None:
        from confluent_kafka import KafkaException, Producer

        conf = dict(kafka_config)
        conf.update(
            {
                "enable.idempotence": True,
                "compression.type": "lz4",
                "linger.ms": linger_ms,
                "message.timeout.ms": 300_000,
                "queue.buffering.max.kbytes": 262_144,
            }
        )
        try:
            self._producer = Producer(conf, logger=logging.getLogger("argus.publisher.kafka"))
        except KafkaException as exc:
            raise PublishError(f"invalid Kafka settings: {exc.args[0]}") from None
        self.delivered = 0
        self.dropped: Counter[str] = Counter()

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.delivered += 1
        else:
            self.dropped[f"delivery: {err.name()}"] += 1
            log.warning("delivery failed: %s", err)

    def publish(self, topic: str, key: bytes, record: Record) -> None:
        """Encode and enqueue one record (never blocks for long, never raises for the broker)."""
        self.publish_raw(topic, key, encode(record))

    def publish_raw(self, topic: str, key: bytes, value: bytes) -> None:
        """Enqueue already-encoded bytes."""
        for _ in range(100):
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=self._on_delivery)
                break
            except BufferError:  # local queue full: let librdkafka send, then retry
                self._producer.poll(0.05)
        else:
            self.dropped["local queue full"] += 1
            return
        self._producer.poll(0)

    def flush(self, timeout: float = 30.0) -> int:
        """Wait for delivery; return how many records are still queued."""
        deadline = time.monotonic() + timeout
        left = len(self._producer)
        while left and time.monotonic() < deadline:
            left = self._producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        return int(left)
