"""The stream worker's heartbeat agent, on the real broker: a simulated rank that never
enters its all-reduce is named on ``argus.anomalies`` within 30 s of the hang, whether
its ranks' heartbeats come one per message (no relay) or as node batches from the relay
(here: half of the hosts batched, half direct, in one job)."""

from __future__ import annotations

import dataclasses
import os
import time
import zlib

import pytest
from confluent_kafka import Consumer

from argus.kafka_admin import ensure_topics
from argus.producers.publisher import Publisher
from argus.producers.simulator import HangScenario, HangSimulator, Layout
from argus.schemas import ALL_TOPICS, ANOMALIES, HEARTBEATS, Anomaly, HeartbeatBatch, decode, job_key
from tests.figures import report
from tests.workers import Worker, fresh_group

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.mark.parametrize("shape", ["direct", "node_batches"])
def test_the_worker_names_a_hung_rank_and_its_all_reduce(kafka_conf, tmp_path, unique, shape) -> None:
    ensure_topics(kafka_conf, ALL_TOPICS, partitions=16)
    job = f"e2e-hang-{shape}-{unique}"
    worker = Worker(fresh_group(kafka_conf, f"hang-{unique}"), tmp_path, kafka_conf["bootstrap.servers"])
    consumer = Consumer({**kafka_conf, "group.id": f"peek-{job}", "auto.offset.reset": "latest"})
    consumer.subscribe([ANOMALIES])
    publisher = Publisher(kafka_conf)
    try:
        history_s = 20.0
        sim = HangSimulator(
            Layout(dp=4, tp=8, pp=4),
            HangScenario("collective_hang", at_s=history_s + 10.0, rank=77),
            job=job,
            heartbeat_s=2.0,
            start_ns=time.time_ns() - int(history_s * 1e9),
        )
        sent_to = sim.start_ns
        found: Anomaly | None = None
        deadline = time.monotonic() + 90
        while found is None and time.monotonic() < deadline:
            now = time.time_ns()
            beats = sim.beats(sent_to, now)
            by_host: dict[tuple[str, int], list] = {}
            for beat in beats:
                if shape == "node_batches" and zlib.crc32(beat.host.encode()) % 2:  # a host with a relay
                    # one batch per host per heartbeat period, as the relay sends
                    by_host.setdefault((beat.host, beat.time_ns // 2_000_000_000), []).append(beat)
                else:
                    publisher.publish(HEARTBEATS, job_key(job), beat)
            for host_beats in by_host.values():
                latest = {b.rank: b for b in sorted(host_beats, key=lambda b: b.time_ns)}
                publisher.publish(HEARTBEATS, job_key(job), HeartbeatBatch.from_beats(list(latest.values())))
            sent_to = now
            publisher.flush(5)
            for m in consumer.consume(100, timeout=0.5):
                if m.error():
                    continue
                a = decode(m.value())
                if a.job == job:
                    found = a
        assert found is not None, "no hang anomaly from the worker"
        assert (found.cause, found.level, found.suspect, found.ranks) == ("hang", "hang", "rank:77", (77,))
        assert "all_reduce" in found.summary and sim.labels[0].group in found.summary
        assert 0 < (found.detected_ns - sim.hang_ns) / 1e9 <= 30
    finally:
        consumer.close()
        publisher.shutdown(5)
        worker.stop()


def test_skewed_host_clocks_neither_page_nor_hide_a_hang_in_the_worker(kafka_conf, tmp_path, unique) -> None:
    """Issue 34, item 6, live: two jobs' heartbeats sent as their hosts' clocks say, one host
    of each 60 s behind and another 1 h ahead. The healthy job gets no page; the hung job's
    rank (on the host 1 h ahead) is named, once, as a hang. Before, the healthy job was
    paged as lost every few seconds and the hang went unnamed."""
    ensure_topics(kafka_conf, ALL_TOPICS, partitions=16)
    healthy, hung = f"skew-ok-{unique}", f"skew-hung-{unique}"
    worker = Worker(fresh_group(kafka_conf, f"skew-{unique}"), tmp_path, kafka_conf["bootstrap.servers"])
    consumer = Consumer({**kafka_conf, "group.id": f"peek-skew-{unique}", "auto.offset.reset": "latest"})
    consumer.subscribe([ANOMALIES])
    publisher = Publisher(kafka_conf)
    layout = Layout(dp=4, tp=8, pp=1, gpus_per_host=8)  # 4 hosts
    start = time.time_ns() - int(10e9)
    sims = {
        healthy: HangSimulator(
            layout,
            HangScenario("collective_hang", at_s=10_000.0, rank=3),
            job=healthy,
            heartbeat_s=1.0,
            start_ns=start,
        ),
        hung: HangSimulator(
            layout,
            HangScenario("collective_hang", at_s=20.0, rank=17),
            job=hung,
            heartbeat_s=1.0,
            start_ns=start,
        ),
    }
    skew = {Layout.host_name(1): -60 * 10**9, Layout.host_name(2): 3600 * 10**9}  # rank 17: host 2
    pages: dict[str, list[Anomaly]] = {healthy: [], hung: []}
    try:
        sent_to, deadline = start, time.monotonic() + float(os.environ.get("ARGUS_TEST_SKEW_S", "45"))
        while time.monotonic() < deadline:
            now = time.time_ns()
            for job, sim in sims.items():
                for beat in sim.beats(sent_to, now):
                    shifted = dataclasses.replace(beat, time_ns=beat.time_ns + skew.get(beat.host, 0))
                    publisher.publish(HEARTBEATS, job_key(job), shifted)
            sent_to = now
            publisher.flush(5)
            for m in consumer.consume(100, timeout=0.5):
                if not m.error():
                    a = decode(m.value())
                    if a.job in pages and a.id not in {p.id for p in pages[a.job]}:
                        pages[a.job].append(a)
    finally:
        consumer.close()
        publisher.shutdown(5)
        worker.stop()
    wrong = [a for a in pages[hung] if (a.cause, a.suspect) != ("hang", "rank:17")]
    report(
        "skewed_clocks",
        sent=1,
        received=int(any(a.suspect == "rank:17" for a in pages[hung])),
        lost=int(not any(a.suspect == "rank:17" for a in pages[hung])),
        duplicated=0,
        skew_false_pages=len(pages[healthy]) + len(wrong),
    )
    assert pages[healthy] == [], [(a.cause, a.suspect) for a in pages[healthy]]
    assert [(a.cause, a.suspect) for a in pages[hung]] == [("hang", "rank:17")]
