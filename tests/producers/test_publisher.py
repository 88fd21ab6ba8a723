"""The publisher's spool (pure file I/O) and the publisher against the real broker."""

from __future__ import annotations

import time

import pytest

from argus.producers.spool import Spool


def recs(a: int, b: int) -> list[tuple[str, bytes, bytes]]:
    return [("t", b"k%d" % (i % 3), b"v%d" % i) for i in range(a, b)]


def test_spool_keeps_order_across_segments_and_reopen(tmp_path):
    s = Spool(tmp_path, segment_bytes=200)
    assert s.append(recs(0, 30)) == 0
    assert s.append(recs(30, 60)) == 0
    assert len(list(tmp_path.glob("*.seg"))) >= 2
    first = s.read(25)
    assert [r[2] for r in first] == [b"v%d" % i for i in range(25)]
    # a new process (crash before commit) replays from the start: at-least-once
    again = Spool(tmp_path)
    assert len(again) == 60
    assert [r[2] for r in again.read(1000)] == [b"v%d" % i for i in range(60)]
    rest = s.read(1000)
    assert [r[2] for r in rest] == [b"v%d" % i for i in range(25, 60)]
    s.commit()
    assert s.bytes == 0 and len(s) == 0 and not list(tmp_path.glob("*.seg"))


def test_spool_is_bounded_and_counts_what_does_not_fit(tmp_path):
    s = Spool(tmp_path, max_bytes=300)
    rejected = s.append(recs(0, 100))
    assert 0 < rejected < 100
    assert len(s) == 100 - rejected and s.bytes <= 300
    assert [r[2] for r in s.read(1000)] == [b"v%d" % i for i in range(100 - rejected)]


def test_spool_prepend_goes_first(tmp_path):
    s = Spool(tmp_path)
    s.append(recs(10, 20))
    s.prepend(recs(0, 10))
    assert [r[2] for r in s.read(1000)] == [b"v%d" % i for i in range(20)]


def test_spool_ignores_a_torn_tail(tmp_path):
    s = Spool(tmp_path)
    s.append(recs(0, 5))
    seg = next(tmp_path.glob("*.seg"))
    seg.write_bytes(seg.read_bytes() + b"\x00\x01\x00\x00")  # a crash mid-write
    again = Spool(tmp_path)
    assert [r[2] for r in again.read(100)] == [b"v%d" % i for i in range(5)]


@pytest.mark.kafka
def test_publisher_delivers_in_order_and_never_raises(kafka_conf, unique, tmp_path):
    from confluent_kafka import Consumer

    from argus.kafka_admin import ensure_topics
    from argus.producers.publisher import Publisher
    from argus.schemas import StepBatch, StepRecord

    topic = f"argus-test-pub-{unique}"
    ensure_topics(kafka_conf, [topic], partitions=3)
    pub = Publisher(kafka_conf, spool_dir=tmp_path / "spool")
    t0 = time.perf_counter()
    for i in range(3000):
        pub.publish_raw(topic, b"r%d" % (i % 4), b"%d" % i)
    per_call_us = (time.perf_counter() - t0) / 3000 * 1e6
    pub.publish(
        topic,
        b"x",
        StepBatch.from_records(
            [StepRecord("j", 0, 1, 0, start_ns=time.time_ns(), end_ns=time.time_ns() + 1)]
        ),
    )
    pub.publish(topic, b"x", StepRecord("j", 0, 1, 0))  # not a Record type the codec knows: counted
    assert pub.flush(30) == 0
    assert pub.delivered == 3001
    assert sum(pub.dropped.values()) == 1
    assert per_call_us < 50
    c = Consumer({**kafka_conf, "group.id": topic, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got: dict[bytes, list[int]] = {}
    deadline = time.monotonic() + 30
    while sum(map(len, got.values())) < 3000 and time.monotonic() < deadline:
        for m in c.consume(1000, 0.5):
            if not m.error() and m.key() != b"x":
                got.setdefault(m.key(), []).append(int(m.value()))
    c.close()
    assert {k: v == sorted(v) for k, v in got.items()} == {b"r%d" % i: True for i in range(4)}
    assert pub.shutdown(5)
    pub.publish_raw(topic, b"k", b"late")
    assert pub.dropped["after shutdown"] == 1


def test_publisher_spools_when_the_broker_is_unreachable(tmp_path):
    """No broker at all: records go to the spool after the stall, shutdown keeps them on disk."""
    from argus.producers.publisher import Publisher

    pub = Publisher({"bootstrap.servers": "127.0.0.1:1"}, spool_dir=tmp_path, stall_s=0.3)
    for i in range(200):
        pub.publish_raw("argus.nowhere", b"k", b"%d" % i)
        time.sleep(0.002)
    time.sleep(0.5)
    assert pub.stats()["stalled"]
    assert pub.shutdown(1.0)
    assert not pub.dropped
    left = Spool(tmp_path)
    assert [int(r[2]) for r in left.read(1000)] == list(range(200))


@pytest.mark.kafka
def test_bulk_publisher_waits_for_room_and_drain_names_what_was_lost(kafka_conf, unique):
    """A tiny queue: the bulk publisher waits and delivers all; the default one drops and says so."""
    from argus.kafka_admin import ensure_topics
    from argus.producers.publisher import Publisher, PublishError

    topic = f"argus-test-bulk-{unique}"
    ensure_topics(kafka_conf, [topic], partitions=2)
    bulk = Publisher(kafka_conf, max_queue=50, block_when_full=True)
    for i in range(20_000):
        bulk.publish_raw(topic, b"k%d" % (i % 7), b"%d" % i)
    bulk.drain(60)
    assert bulk.delivered == 20_000 and not bulk.dropped
    bulk.shutdown(5)

    lossy = Publisher(kafka_conf, max_queue=50)
    for i in range(20_000):
        lossy.publish_raw(topic, b"k", b"%d" % i)
    with pytest.raises(PublishError, match="queue full"):
        lossy.drain(60)
    assert lossy.delivered + lossy.dropped["queue full"] == 20_000
    lossy.shutdown(5)


def test_a_bulk_publisher_does_not_wait_for_a_broker_that_is_not_there():
    """No broker and librdkafka's own queue full: publish stops waiting once the broker is
    stalled, every record is counted lost, drain raises and shutdown says records were lost."""
    from argus.producers.publisher import Publisher, PublishError

    pub = Publisher(
        {"bootstrap.servers": "127.0.0.1:1", "queue.buffering.max.messages": 20},
        max_queue=50,
        block_when_full=True,
        stall_s=0.3,
    )
    began = time.monotonic()
    for i in range(2_000):
        pub.publish_raw("argus.nowhere", b"k", b"%d" % i)
    assert time.monotonic() - began < 30
    with pytest.raises(PublishError, match="not delivered"):
        pub.drain(1)
    assert sum(pub.dropped.values()) + pub.pending() == 2_000
    assert not pub.shutdown(1)


def test_step_records_checked_together_still_drop_only_the_bad_one(tmp_path):
    """A round's StepBatches are validated in one pass; one bad batch among them is dropped
    and counted, the others are encoded and kept in order."""
    import numpy as np

    from argus.producers.publisher import Publisher
    from argus.schemas import StepBatch, decode

    def batch(step: int, forward_ms: float) -> StepBatch:
        cols = StepBatch.empty_columns(1)
        now = time.time_ns()
        cols.update(
            rank=np.array([3]),
            host=np.array(["node-0"], dtype=object),
            gpu_uuid=np.array(["GPU-0"], dtype=object),
            start_ns=np.array([now]),
            end_ns=np.array([now + 50_000_000]),
            forward_ms=np.array([forward_ms]),
        )
        return StepBatch("job", 0, step, cols)

    pub = Publisher({"bootstrap.servers": "127.0.0.1:1"}, spool_dir=tmp_path, stall_s=0.3, wake_ms=60_000)
    for step in range(6):
        pub.publish("argus.steps", b"k", batch(step, float("nan") if step == 2 else 10.0 + step))
    pub.shutdown(1.0)
    assert pub.dropped == {"invalid record: ValidationError": 1}
    kept = [decode(r[2]) for r in Spool(tmp_path).read(100)]
    assert [(b.step, float(b["forward_ms"][0])) for b in kept] == [(s, 10.0 + s) for s in (0, 1, 3, 4, 5)]
