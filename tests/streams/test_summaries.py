"""Every step the worker completes gets exactly one summary on ``argus.step-summaries``, or a
counter and a log line say why not (issue 34, item 1), on the real broker and `argus worker`."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from argus.kafka_admin import end_offsets, read_records
from argus.producers.publisher import Publisher
from argus.schemas import STEP_SUMMARIES, STEPS
from argus.simulate import layout_for, parse_fault, publish_simulation
from tests.figures import report
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


def _burn(stop: Any) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def test_a_1024_rank_job_replayed_on_a_loaded_machine_has_one_summary_per_step(
    kafka_conf, worker_factory, unique
) -> None:
    """The issue's replay: a 1,024-rank job (64 ranks per message) published as fast as the
    publisher goes, through the broker and `argus worker`, while two processes burn the CPU.
    Every step gets exactly one summary; a step the temporal stage had to give up on counts
    as late, never as missing. ARGUS_TEST_SUMMARY_STEPS sets the length (CI: 150; the bench:
    1,000, or 300 with --quick)."""
    import multiprocessing

    steps = int(os.environ.get("ARGUS_TEST_SUMMARY_STEPS", "150"))
    job = f"replay-{unique}"
    app = fresh_group(kafka_conf, f"r-{unique}")
    start = end_offsets(kafka_conf, [STEP_SUMMARIES])
    worker = worker_factory(app)
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=_burn, args=(stop,), daemon=True) for _ in range(2)]
    for b in burners:
        b.start()
    began = time.monotonic()
    try:
        publisher = Publisher(kafka_conf)
        layout = layout_for(1024)
        publish_simulation(
            publisher.publish,
            job=job,
            layout=layout,
            steps=steps,
            faults=[parse_fault(f"compute_straggler@{steps // 3}+{steps // 4}:77", layout)],
            seed=11,
            ranks_per_message=64,
        )
        assert publisher.flush(60) == 0
        seen, last = [-1], [time.monotonic()]  # summaries read, and when the count last grew

        def done(c: Counter[int]) -> bool:
            now = time.monotonic()
            if c.total() != seen[0]:
                seen[0], last[0] = c.total(), now
            return (len(c) >= steps and now - last[0] > 5) or now - last[0] > 90

        counts = _summaries(kafka_conf, start, job, done, timeout=120 + steps)
    finally:
        stop.set()
        for b in burners:
            b.join(5)
    seconds = time.monotonic() - began
    worker.stop()
    log = Path(worker.log.name).read_text()
    missing = sorted(set(range(steps)) - set(counts))
    doubled = {s: n for s, n in counts.items() if n > 1}
    report(
        "summaries_1024_ranks",
        sent=steps,
        received=len(counts),
        lost=len(missing),
        duplicated=sum(n - 1 for n in doubled.values()),
        summaries_missing=len(missing),
        late_summaries=log.count("came after the diagnosis went past it"),
        seconds_to_last_summary=round(seconds, 1),
    )
    assert not missing, (missing[:40], log[-3000:])
    assert not doubled, doubled
