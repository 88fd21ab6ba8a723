"""The batch intake (:mod:`streams.intake`) on the real broker: every message handed over
once in its partition's order, offsets committed only after a batch is handled (a new
consumer in the same group resumes where the handled batches end), a handler that raises
does not stop the reading, and a partition first seen with messages older than
``max_age_s`` is moved to its end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest
from confluent_kafka import Producer

from argus.kafka_admin import ensure_topics
from argus.streams.intake import BatchIntake, RawInput

pytestmark = pytest.mark.kafka


def produce(kafka_conf, topic: str, values: range, *, timestamp_ms: int = 0) -> None:
    producer = Producer(kafka_conf)
    for v in values:
        producer.produce(topic, key=b"k", value=b"%d" % v, timestamp=timestamp_ms)
    assert producer.flush(30) == 0


def read(intake: BatchIntake, want: int, *, fail_first: bool = False, timeout: float = 60.0) -> list[int]:
    """Run the intake until ``want`` values were handed over (or the timeout), then stop it."""
    got: list[int] = []
    calls = [0]

    async def handle(batch: Sequence[RawInput]) -> None:
        calls[0] += 1
        got.extend(int(raw.value) for raw in batch)
        if fail_first and calls[0] == 1:
            raise RuntimeError("a bug in the handler")

    async def main() -> None:
        task = asyncio.create_task(intake.run(handle))
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # anything beyond what was wanted would show up now
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(1.0)  # the consumer closes (and commits) in its own thread

    asyncio.run(main())
    return got


def test_each_message_once_in_order_and_a_new_consumer_resumes_after_the_handled(kafka_conf, unique) -> None:
    topic = f"argus-test-intake-{unique}"
    ensure_topics(kafka_conf, [topic], partitions=1)
    produce(kafka_conf, topic, range(500))
    first = read(BatchIntake(kafka_conf, f"g-{unique}", [topic], max_batch=64), 500, fail_first=True)
    assert first == list(range(500))  # the batch whose handler raised is not read again
    produce(kafka_conf, topic, range(500, 520))
    again = read(BatchIntake(kafka_conf, f"g-{unique}", [topic], max_batch=64), 20)
    assert again == list(range(500, 520))


def test_a_partition_older_than_max_age_is_moved_to_its_end(kafka_conf, unique) -> None:
    topic = f"argus-test-intake-old-{unique}"
    ensure_topics(kafka_conf, [topic], partitions=1)
    produce(kafka_conf, topic, range(100), timestamp_ms=int((time.time() - 3600) * 1000))  # an hour old

    async def later() -> None:
        await asyncio.sleep(3.0)
        produce(kafka_conf, topic, range(100, 110))

    intake = BatchIntake(kafka_conf, f"g-{unique}", [topic], max_age_s=600)
    got: list[int] = []

    async def main() -> None:
        async def handle(batch: Sequence[RawInput]) -> None:
            got.extend(int(raw.value) for raw in batch)

        task = asyncio.create_task(intake.run(handle))
        await asyncio.get_running_loop().run_in_executor(None, lambda: asyncio.run(later()))
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert got == list(range(100, 110))
    assert intake.skipped == {(topic, 0)}
