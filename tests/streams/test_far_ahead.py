"""A record far ahead of its job (issue 34, item 3), through the real broker and `argus worker`."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Consumer

from argus.kafka_admin import end_offsets
from argus.producers.publisher import Publisher
from argus.schemas import DEAD_LETTER, STEP_SUMMARIES, STEPS, StepBatch, job_key, step_key
from argus.simulate import layout_for, publish_simulation
from tests.streams.test_summaries import _summaries
from tests.workers import fresh_group

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_one_record_50000_steps_ahead_is_dead_lettered_and_the_job_goes_on(
    kafka_conf, worker_factory, unique
) -> None:
    """A live job at 10 steps/s; after its step 30 one record claims step 50,030 (inside the
    fixed 100,000 bound). Before, it was held 30 s, released as the job's latest step, and
    every real step after it was dropped as old: the job's summaries stopped. Now it is
    further ahead than the job could have run since its frontier moved, so it is
    dead-lettered (``far_future``) and every real step is summarized."""
    job, steps, at, ahead = f"far-{unique}", 420, 30, 50_000
    app = fresh_group(kafka_conf, f"f-{unique}")
    start = end_offsets(kafka_conf, [STEP_SUMMARIES, DEAD_LETTER])
    worker_factory(app)
    publisher = Publisher(kafka_conf)

    def publish(topic: str, key: bytes, record: Any) -> None:
        publisher.publish(topic, key, record)
        if topic == STEPS and record.step == at:
            far = StepBatch(job, record.run, at + ahead, dict(record.columns))
            publisher.publish(STEPS, step_key(job, far.step), far)

    publish_simulation(publish, job=job, layout=layout_for(64), steps=steps, seed=5, rate=10.0)
    assert publisher.flush(30) == 0
    counts = _summaries(
        kafka_conf,
        {tp: o for tp, o in start.items() if tp[0] == STEP_SUMMARIES},
        job,
        lambda c: len(c) >= steps,
        timeout=90,
    )
    assert set(counts) == set(range(steps)), sorted(set(range(steps)) - set(counts))[:20]
    assert at + ahead not in counts
    c = Consumer({**kafka_conf, "group.id": f"dlq-{unique}", "auto.offset.reset": "earliest"})
    c.subscribe([DEAD_LETTER])
    reasons, deadline = [], time.monotonic() + 30
    while not reasons and time.monotonic() < deadline:
        for m in c.consume(500, timeout=0.5):
            # the cross-rank stage's (keyed by step) or, early in a job, the temporal one's
            if not m.error() and m.key() in (step_key(job, at + ahead), job_key(job)):
                reasons.append(dict(m.headers() or [])["argus-reason"].decode())
    c.close()
    assert reasons == ["far_future"]
