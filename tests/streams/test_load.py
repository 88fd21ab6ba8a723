"""Load: twice the throughput goal (2 × 50,000 rank-steps/s) into one worker; its lag stays
bounded and its memory flat. CI runs it for ARGUS_TEST_LOAD_S (default 10 s);
bench/reliability.py for 10 minutes (2 with --quick)."""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest

from argus.producers.publisher import Publisher
from argus.simulate import layout_for, publish_simulation
from tests.figures import report
from tests.workers import collect, fresh_group

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

RANKS = 4096
RATE = 2 * 50_000 / RANKS  # steps per second at twice the goal


def test_twice_the_goal_keeps_lag_bounded_and_memory_flat(kafka_conf, worker_factory, unique) -> None:
    seconds = float(os.environ.get("ARGUS_TEST_LOAD_S", "10"))
    steps = int(seconds * RATE)
    job = f"load-{unique}"
    # Start the worker at the end of the topics: its lag is this job's, not the broker's history.
    worker = worker_factory(fresh_group(kafka_conf, f"l-{unique}"))
    proc = psutil.Process(worker.proc.pid)
    publisher = Publisher(kafka_conf)
    pub = threading.Thread(
        target=lambda: publish_simulation(
            publisher.publish, job=job, layout=layout_for(RANKS), steps=steps, seed=3, rate=RATE
        )
    )
    rss: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            rss.append(proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    pub.start()
    sampler.start()
    pub.join()
    publisher.flush(60)
    published_s = time.monotonic() - started
    _, done = collect(kafka_conf, job, until=lambda a, s: len(s) >= steps, timeout=60 + seconds)
    caught_up_s = time.monotonic() - started - published_s
    stop.set()
    sampler.join(5)
    third = max(1, len(rss) // 3)
    early, late = max(rss[third : 2 * third] or rss), max(rss[-third:])  # after start-up, then at the end
    report(
        "load_2x",
        sent=steps * RANKS,
        received=len(done) * RANKS,
        lost=(steps - len(done)) * RANKS,
        duplicated=0,
        rank_steps_per_s=round(steps * RANKS / published_s),
        catch_up_s=round(caught_up_s, 2),
        worker_rss_mb=round(max(rss) / 2**20, 1),
        rss_growth_pct=round(100 * (late - early) / early, 1),
    )
    assert len(done) == steps
    assert steps * RANKS / published_s >= 90_000, "the publisher could not offer twice the goal"
    assert caught_up_s < 20, f"the worker was {caught_up_s:.1f} s behind when publishing ended"
    assert late < early * 1.3 + (64 << 20), f"worker memory grew from {early >> 20} to {late >> 20} MB"
