"""A topic read in consumer batches by librdkafka, beside Faust's per-event streams.

Faust hands an agent one event at a time: for each message a ``Message``, an ``Event``, a
channel queue, the stream's processors and an acknowledgement, some tens of microseconds
of Python. That is fine for step parts (one per host per step) and far too much for the
inputs that come per rank: heartbeats (every rank every few seconds) and kernel sketches
and stack samples (two per rank per step), whose own work is a few microseconds each. Measured on node batches of 8 ranks
(16,384 ranks, one process): decode and hang bookkeeping alone take about 350k heartbeats
per CPU-second; through a Faust agent the worker took 62–72k.

So :class:`BatchIntake` reads such a topic with its own librdkafka consumer, in its own
consumer group (``<app id>-<name>``: the partitions are shared among the workers like the
app's), a batch at a time, and hands each batch to a coroutine on the worker's event loop.
The consumer runs in one thread of its own (every call to it goes there, in order), so the
loop never blocks on Kafka. Offsets are stored only after the coroutine has handled the
batch (dead letters delivered) and committed in the background: a worker that dies
re-reads at most the batches since its last commit, and loses none.

Only state that may be rebuilt from the input belongs behind an intake: nothing here is a
table, and a rebalance needs no handover (the hang tracker's state is the last few seconds
of heartbeats, :mod:`streams.hangs`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

__all__ = ["BatchIntake", "RawInput", "intake_group"]

log = logging.getLogger("argus.streams")


@dataclass(frozen=True, slots=True)
class RawInput:
    """One message as read: where it came from and its bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes
    time_s: float = 0.0
    """The message's timestamp (seconds since the epoch; 0 when it has none)."""

    @classmethod
    def of_event(cls, event: Any) -> RawInput:
        """The same for a Faust event."""
        msg = event.message
        return cls(
            msg.topic,
            msg.partition,
            msg.offset,
            bytes(msg.key or b""),
            bytes(event.value or b""),
            msg.timestamp,
        )


def intake_group(app_id: str, name: str) -> str:
    """The consumer group of an app's intake called ``name``."""
    return f"{app_id}-{name}"


class BatchIntake:
    """Read ``topics`` in batches of up to ``max_batch`` messages and hand them to a coroutine.

    Args:
        kafka_config: librdkafka settings for the brokers (bootstrap servers, security).
        group: the consumer group (:func:`intake_group`).
        topics: what to read.
        max_batch: messages per batch at most.
        poll_s: how long one poll waits for a message (and how soon a stop is seen).
        max_fetch_bytes: one fetch's bytes at most (a node's heartbeats are small; a job's
            are one partition, so a larger fetch keeps its batches long).
        max_age_s: a partition first seen with a message older than this is moved to its
            end, once (a new group on a topic's backlog of best-effort input: what is that
            old is of no use, and reading it would delay what is not). None: never.
    """

    def __init__(
        self,
        kafka_config: Mapping[str, Any],
        group: str,
        topics: Sequence[str],
        *,
        max_batch: int = 2048,
        poll_s: float = 0.25,
        max_fetch_bytes: int = 8 * 2**20,
        max_age_s: float | None = None,
    ) -> None:
        self.conf = {
            **kafka_config,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 500,
            "enable.auto.offset.store": False,  # stored once a batch is handled
            "fetch.max.bytes": max_fetch_bytes,
            "max.partition.fetch.bytes": max_fetch_bytes,
        }
        self.topics = list(topics)
        self.name = ",".join(self.topics)
        self.max_age_s = max_age_s
        self.skipped: set[tuple[str, int]] = set()  # partitions moved to their end once
        self.max_batch = max_batch
        self.poll_s = poll_s
        self.batches = 0
        self.errors = 0

    async def run(self, handle: Callable[[Sequence[RawInput]], Awaitable[None]]) -> None:
        """Read until cancelled: each batch through ``handle``, then its offsets stored. A
        batch whose ``handle`` raises is logged and its offsets stored all the same (the
        handler dead-letters what it cannot take; an error escaping it is a bug, and
        reading the batch again would only repeat it)."""
        from confluent_kafka import Consumer

        loop = asyncio.get_running_loop()
        kafka = ThreadPoolExecutor(1, thread_name_prefix=f"argus-intake-{self.name}")
        consumer = await loop.run_in_executor(kafka, Consumer, self.conf)
        try:
            await loop.run_in_executor(kafka, consumer.subscribe, self.topics)
            while True:
                batch = await loop.run_in_executor(kafka, self._poll, consumer)
                if not batch:
                    continue
                try:
                    await handle(batch)
                except Exception:
                    log.exception("handling a batch of %d from %s failed", len(batch), self.name)
                ends = {(raw.topic, raw.partition): raw.offset + 1 for raw in batch}
                await loop.run_in_executor(kafka, self._store, consumer, ends)
                self.batches += 1
        finally:
            kafka.submit(consumer.close)  # after the poll in flight; commits what was stored
            kafka.shutdown(wait=False)

    def _poll(self, consumer: Any) -> list[RawInput]:
        out = []
        for msg in consumer.consume(self.max_batch, timeout=self.poll_s):
            err = msg.error()
            if err is not None:  # partition EOF, a broker away: librdkafka goes on by itself
                if not err.retriable() and err.fatal():
                    log.error("%s consumer: %s", self.name, err)
                self.errors += 1
                continue
            ms = msg.timestamp()[1]
            out.append(
                RawInput(
                    msg.topic(), msg.partition(), msg.offset(), msg.key() or b"", msg.value() or b"", ms / 1e3
                )
            )
        return self._recent_only(consumer, out) if self.max_age_s is not None and out else out

    def _recent_only(self, consumer: Any, batch: list[RawInput]) -> list[RawInput]:
        from confluent_kafka import TopicPartition

        cutoff = time.time() - (self.max_age_s or 0.0)
        stale = {(r.topic, r.partition) for r in batch if 0 < r.time_s < cutoff} - self.skipped
        for topic, partition in stale:
            self.skipped.add((topic, partition))
            _, end = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            consumer.seek(TopicPartition(topic, partition, end))
            log.info(
                "%s[%d]: older than %.0f s, moved to its end (%d)", topic, partition, self.max_age_s, end
            )
        return [r for r in batch if not 0 < r.time_s < cutoff]

    @staticmethod
    def _store(consumer: Any, ends: dict[tuple[str, int], int]) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            consumer.store_offsets(offsets=[TopicPartition(t, p, o) for (t, p), o in ends.items()])
        except KafkaException as exc:  # the partition was revoked meanwhile: its new owner reads it
            log.debug("storing offsets: %s", exc)
