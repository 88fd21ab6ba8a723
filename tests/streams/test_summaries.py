"""Every step the worker completes gets exactly one summary on ``argus.step-summaries``, or a
counter and a log line say why not (issue 34, item 1), on the real broker and `argus worker`."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from argus.kafka_admin import end_offsets, read_records
from argus.producers.publisher import Publisher
from argus.schemas import STEP_SUMMARIES, STEPS
from argus.simulate import layout_for, publish_simulation
from tests.workers import fresh_group

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _summaries(kafka_conf: dict[str, Any], start: Any, job: str, until: Any, timeout: float) -> Counter[int]:
    """Summaries of ``job`` per step, read from ``start`` until ``until(counts)`` holds."""
    counts: Counter[int] = Counter()

    def take(topic: str, r: Any) -> None:
        if topic == STEP_SUMMARIES and r.job == job:
            counts[r.step] += 1

    read_records(kafka_conf, start, take, until=lambda: until(counts), timeout=timeout)
    return counts


def test_a_step_whose_findings_come_after_the_job_moved_on_still_gets_its_one_summary(
    kafka_conf, worker_factory, unique
) -> None:
    """Step 10's parts reach the worker only after the 89 later steps were summarized: the
    temporal stage gave up waiting for it (a timer's release order: no later step came to
    let the held ones go) and diagnosed on. When step 10 comes, its summary is sent all the
    same (once), and the worker counts and logs the late step; before, the stage took it for
    a replayed duplicate and dropped it without a word (a stalled partition did this to 183
    of 1,500 steps of a 1,024-rank job)."""
    job, steps, late = f"late-{unique}", 100, 10
    app = fresh_group(kafka_conf, f"s-{unique}")
    start = end_offsets(kafka_conf, [STEP_SUMMARIES])
    worker = worker_factory(app, "--loglevel", "info")
    publisher = Publisher(kafka_conf)
    held: list[tuple[str, bytes, Any]] = []

    def publish(topic: str, key: bytes, record: Any) -> None:
        if topic == STEPS and record.step == late:
            held.append((topic, key, record))
        else:
            publisher.publish(topic, key, record)

    publish_simulation(publish, job=job, layout=layout_for(256), steps=steps, seed=7)
    assert publisher.flush(30) == 0 and held
    before = _summaries(kafka_conf, start, job, lambda c: len(c) >= steps - 1, timeout=120)
    assert late not in before and len(before) == steps - 1, sorted(set(range(steps)) - set(before))
    for topic, key, record in held:
        publisher.publish(topic, key, record)
    assert publisher.flush(30) == 0
    counts = _summaries(
        kafka_conf, start, job, lambda c: len(c) >= steps and time.sleep(3) is None, timeout=60
    )
    assert set(counts) == set(range(steps)), sorted(set(range(steps)) - set(counts))
    assert all(n == 1 for n in counts.values()), {s: n for s, n in counts.items() if n != 1}
    worker.stop()
    log = Path(worker.log.name).read_text()
    assert f"job {job} run 0: step {late} came after the diagnosis went past it" in log, log[-3000:]
    assert "late 1: came after the diagnosis went past it, summary sent" in log, log[-3000:]
    assert f"steps {late}-{late} not in after waiting" in log, log[-3000:]
