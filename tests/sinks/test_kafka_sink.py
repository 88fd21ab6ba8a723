"""The exactly-once sink on the real broker and real chDB."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from argus.kafka_admin import ensure_topics
from argus.schemas import ANOMALIES, STEPS, Anomaly, StepBatch, encode, step_key
from argus.sinks import StoreUnavailableError, to_arrow
from argus.sinks.kafka_sink import KafkaSink
from argus.sinks.store import dedup_settings
from tests.figures import report
from tests.records import T0, step_batch

pytestmark = pytest.mark.kafka


class Borrowed:
    """The session store lent to a sink: the sink may close it, the session keeps it open.
    ``before_insert`` runs before every insert: it may raise (a store that is down) or wait."""

    def __init__(self, store: Any, before_insert: Callable[[], object] | None = None) -> None:
        self._store = store
        self._before_insert = before_insert

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def insert_arrow(self, *args: Any, **kwargs: Any) -> None:
        if self._before_insert is not None:
            self._before_insert()
        self._store.insert_arrow(*args, **kwargs)

    def close(self) -> None:
        pass


def refuse() -> None:
    """A store that is down."""
    raise StoreUnavailableError("connection refused (test outage)")


def died_after_insert(
    conf: dict[str, Any], store: Any, topic: str, group: str, recs: list[Any], last: int
) -> None:
    """What a sink that died after inserting offsets 0..``last`` of partition 0, before
    committing them, had done: the intent commit, then the insert."""
    c = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 0, metadata=f"argus:{last}")], asynchronous=False)
    c.close()
    table, data = to_arrow(recs[: last + 1])
    store.insert_arrow(table, data, settings=dedup_settings(f"steps:{topic}:0:0-{last}"))


def committed(conf: dict[str, Any], topic: str, group: str) -> TopicPartition:
    """Partition 0's committed offset (and metadata) for ``group``."""
    c = Consumer({**conf, "group.id": group})
    (tp,) = c.committed([TopicPartition(topic, 0)], timeout=10)
    c.close()
    return tp


def make_topic(conf: dict[str, Any], name: str, partitions: int = 2) -> str:
    assert ensure_topics(conf, [name], partitions=partitions) == [name]
    return name


def batches(job: str, steps: int, ranks: int = 8) -> list[StepBatch]:
    out = []
    for s in range(steps):
        b = step_batch(ranks, step=s)
        out.append(StepBatch(job, b.run, s, b.columns))
    return out


def produce(conf: dict[str, Any], topic: str, records: list[Any], extra: list[bytes] = ()) -> None:
    p = Producer({**conf, "enable.idempotence": True, "linger.ms": 5})
    for r in records:
        p.produce(topic, key=step_key(r.job, getattr(r, "step", 0)), value=encode(r))
    for raw in extra:
        p.produce(topic, key=b"junk", value=raw)
    assert p.flush(30) == 0


def count(store: Any, table: str, job: str) -> int:
    return store.query_rows(f"SELECT count() FROM {table} WHERE job = {{j:String}}", {"j": job})[0][0]


def drain(sink: KafkaSink, store: Any, job: str, want: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    got = 0
    while time.monotonic() < deadline and got < want:
        sink.poll(0.3)
        got = count(store, "steps", job)
    sink.flush_all()
    return count(store, "steps", job)


def test_records_arrive_exactly_once_with_dead_letters(kafka_conf, store, unique) -> None:
    topic = make_topic(kafka_conf, f"t-steps-{unique}")
    job = f"sink-{unique}"
    recs = batches(job, 50)
    anomaly = Anomaly(
        f"an-{unique}",
        job,
        1,
        3,
        5,
        "cross_rank",
        "rank",
        "2",
        (2,),
        "compute_straggler",
        6.0,
        {"z": 6.0},
        "",
        1.0,
        0.1,
        T0,
    )
    produce(kafka_conf, topic, recs, extra=[b"garbage", b"\x00\x00\x00\x03\xe7xx"])
    pages = make_topic(kafka_conf, f"t-anomalies-{unique}")
    produce(kafka_conf, pages, [anomaly])
    sink = KafkaSink(
        lambda: Borrowed(store),
        kafka_conf,
        topics={topic: STEPS, pages: ANOMALIES},
        group=f"g-{unique}",
        batch_seconds=0.2,
    )
    try:
        assert drain(sink, store, job, 400) == 400
        time.sleep(0.5)
        sink.poll(0.5)
        sink.flush_all()
    finally:
        sink.close()
    assert count(store, "steps", job) == 400
    assert store.query_rows("SELECT count() FROM anomalies WHERE id = {i:String}", {"i": f"an-{unique}"}) == [
        (1,)
    ]
    dead = store.query_rows(
        "SELECT reason, count() FROM dead_letters WHERE topic = {t:String} GROUP BY reason ORDER BY reason",
        {"t": topic},
    )
    assert dead == [("decode", 1), ("unknown_schema", 1)]
    assert sink.stats.dead_letters == 2

    # A second sink in the same group finds nothing left to do: offsets were committed.
    again = KafkaSink(
        lambda: Borrowed(store), kafka_conf, topics={topic: STEPS}, group=f"g-{unique}", batch_seconds=0.2
    )
    try:
        for _ in range(10):
            again.poll(0.3)
        again.flush_all()
    finally:
        again.close()
    assert again.stats.messages == 0
    assert count(store, "steps", job) == 400


def test_an_unfinished_insert_is_replayed_without_duplicates(kafka_conf, store, unique) -> None:
    """A sink died after inserting offsets 0..9 of partition 0 but before committing them."""
    topic = make_topic(kafka_conf, f"t-replay-{unique}", partitions=1)
    job = f"replay-{unique}"
    recs = batches(job, 30)
    produce(kafka_conf, topic, recs)
    group = f"g-{unique}"
    died_after_insert(kafka_conf, store, topic, group, recs, 9)
    assert count(store, "steps", job) == 80

    sink = KafkaSink(
        lambda: Borrowed(store), kafka_conf, topics={topic: STEPS}, group=group, batch_seconds=0.2
    )
    try:
        assert drain(sink, store, job, 240) == 240
    finally:
        sink.close()
    per_step = store.query_rows(
        "SELECT step, count() FROM steps WHERE job = {j:String} GROUP BY step ORDER BY step", {"j": job}
    )
    assert per_step == [(s, 8) for s in range(30)]


def test_store_outage_is_retried_until_it_returns(kafka_conf, store, unique) -> None:
    """The store refuses inserts for a while (as a restarted ClickHouse would); nothing is lost."""
    topic = make_topic(kafka_conf, f"t-outage-{unique}", partitions=1)
    job = f"outage-{unique}"
    steps = int(os.environ.get("ARGUS_TEST_STORE_STEPS", "20"))
    produce(kafka_conf, topic, batches(job, steps))
    outage_s = float(os.environ.get("ARGUS_TEST_STORE_OUTAGE_S", "2"))
    down_until = time.monotonic() + outage_s
    sink = KafkaSink(
        lambda: Borrowed(store, lambda: time.monotonic() < down_until and refuse()),
        kafka_conf,
        topics={topic: STEPS},
        group=f"g-{unique}",
        batch_seconds=0.2,
        max_backoff_s=0.5,
    )
    try:
        assert drain(sink, store, job, 8 * steps, timeout=outage_s + 60) == 8 * steps
    finally:
        sink.close()
    assert sink.stats.insert_retries >= 1
    per_step = store.query_rows(
        "SELECT count(), uniqExact(step, rank) FROM steps WHERE job = {j:String}", {"j": job}
    )
    rows, unique_rows = per_step[0]
    report(
        "store_outage",
        sent=8 * steps,
        received=unique_rows,
        lost=8 * steps - unique_rows,
        duplicated=rows - unique_rows,
        outage_s=outage_s,
        retries=sink.stats.insert_retries,
    )
    assert rows == unique_rows == 8 * steps


def test_a_replay_cut_by_other_chunks_ends_at_the_recorded_offset_and_rollups_count_once(
    kafka_conf, store, unique
) -> None:
    """Issue 17, item 6: the dead sink had cut offsets 0..2 (3 messages in one chunk); the
    replaying sink gets one message per poll and flushes on age, which cut 0..0 with a new
    token before: steps collapses on merge, steps_minutely and steps_rank_minutely never."""
    topic = make_topic(kafka_conf, f"t-rechunk-{unique}", partitions=1)
    job = f"rechunk-{unique}"
    recs = batches(job, 6)
    produce(kafka_conf, topic, recs)
    group = f"g-{unique}"
    died_after_insert(kafka_conf, store, topic, group, recs, 2)
    sink = KafkaSink(
        lambda: Borrowed(store),
        kafka_conf,
        topics={topic: STEPS},
        group=group,
        batch_rows=1,
        batch_seconds=0.001,
        max_poll_messages=1,
    )
    try:
        assert drain(sink, store, job, 48) == 48
    finally:
        sink.close()
    minutely = store.query_rows("SELECT sum(rows) FROM steps_minutely WHERE job = {j:String}", {"j": job})
    per_rank = store.query_rows(
        "SELECT sum(steps), uniqExact(rank) FROM steps_rank_minutely WHERE job = {j:String}", {"j": job}
    )
    raw = store.query_rows("SELECT count() FROM steps WHERE job = {j:String}", {"j": job})
    counted = max(minutely[0][0], per_rank[0][0])
    report("replay_rechunked", sent=48, received=raw[0][0], lost=48 - raw[0][0], duplicated=counted - 48)
    assert (raw, minutely, per_rank) == ([(48,)], [(48,)], [(48, 8)])


def _days_apart(job: str, ranks: int) -> StepBatch:
    b = step_batch(ranks, step=0)
    cols = dict(b.columns)
    cols["end_ns"] = T0 + np.arange(ranks, dtype=np.int64) * 86_400 * 10**9
    cols["start_ns"] = cols["end_ns"] - 100_000_000
    return StepBatch(job, b.run, 0, cols)


def test_a_batch_the_store_rejects_is_split_and_the_bad_record_dead_lettered(
    kafka_conf, store, unique
) -> None:
    """Issue 17, item 5: one valid StepBatch of 101 ranks on 101 different days gets "Too many
    partitions for single INSERT block"; the sink retried it forever (store_down 1)."""
    topic = make_topic(kafka_conf, f"t-reject-{unique}", partitions=1)
    job = f"reject-{unique}"
    good = batches(job, 10)
    bad = _days_apart(f"bad-{unique}", 101)
    produce(kafka_conf, topic, [*good[:5], bad, *good[5:]])
    sink = KafkaSink(
        lambda: Borrowed(store), kafka_conf, topics={topic: STEPS}, group=f"g-{unique}", batch_seconds=0.5
    )
    try:
        assert drain(sink, store, job, 80) == 80
    finally:
        sink.close()
    assert sink.stats.insert_retries == 0 and sink.stats.store_down_since is None and sink.stats.rejected == 1
    dead = store.query_rows(
        "SELECT reason, offset, error FROM dead_letters WHERE topic = {t:String}", {"t": topic}
    )
    assert [(r, o) for r, o, _ in dead] == [("rejected", 5)] and "partitions" in dead[0][2].lower()
    assert count(store, "steps", f"bad-{unique}") == 0


def test_a_stop_ends_the_retries_of_an_unavailable_store(kafka_conf, store, unique) -> None:
    """SIGTERM (the stop event) did not stop a sink retrying; now it leaves, nothing committed."""
    import threading

    topic = make_topic(kafka_conf, f"t-down-{unique}", partitions=1)
    produce(kafka_conf, topic, batches(f"down-{unique}", 3))
    sink = KafkaSink(
        lambda: Borrowed(store, refuse),
        kafka_conf,
        topics={topic: STEPS},
        group=f"g-{unique}",
        batch_seconds=0.1,
    )
    stop = threading.Event()
    runner = threading.Thread(target=sink.run, args=(stop,))
    runner.start()
    while sink.stats.insert_retries < 2:
        runner.join(0.1)
        assert runner.is_alive()
    stop.set()
    runner.join(60)
    assert not runner.is_alive()
    tp = committed(kafka_conf, topic, f"g-{unique}")
    assert (tp.offset, tp.metadata) == (0, "argus:2")  # the intent stays: the next sink replays it


def test_a_deadline_ends_the_retries_with_an_error(kafka_conf, store, unique) -> None:
    from argus.sinks import SinkError

    topic = make_topic(kafka_conf, f"t-deadline-{unique}", partitions=1)
    produce(kafka_conf, topic, batches(f"deadline-{unique}", 1))
    sink = KafkaSink(
        lambda: Borrowed(store, refuse),
        kafka_conf,
        topics={topic: STEPS},
        group=f"g-{unique}",
        batch_seconds=0.1,
        max_backoff_s=0.2,
        retry_deadline_s=1.0,
    )
    import threading

    with pytest.raises(SinkError, match="unavailable for 1 s"):
        sink.run(threading.Event(), idle_exit_s=30)


def test_a_megabyte_of_garbage_is_dead_lettered_with_a_prefix_and_its_size(kafka_conf, store, unique) -> None:
    """Issue 17, item 10 (the sink's side): the dead letter kept the whole input."""
    topic = make_topic(kafka_conf, f"t-big-{unique}", partitions=1)
    p = Producer({**kafka_conf, "message.max.bytes": 2_000_000})
    p.produce(topic, key=b"junk", value=b"\x00\x00\x00\x00\x0b" + b"\xab" * 1_000_000)
    assert p.flush(30) == 0
    sink = KafkaSink(
        lambda: Borrowed(store), kafka_conf, topics={topic: STEPS}, group=f"g-{unique}", batch_seconds=0.1
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sink.stats.dead_letters < 1:
            sink.poll(0.3)
        sink.flush_all()
    finally:
        sink.close()
    rows = store.query_rows(
        "SELECT length(payload), error FROM dead_letters WHERE topic = {t:String}", {"t": topic}
    )
    assert len(rows) == 1 and rows[0][0] == 64 << 10 and "1000005 bytes" in rows[0][1]


def _poll_until(sink: KafkaSink, done: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, (sink.readiness(), sink.liveness())
        sink.poll(0.2)


def test_health_follows_the_group_the_polling_and_the_store(kafka_conf, store, unique) -> None:
    """Ready once in the group, polling and the store answered; not ready while the store is
    retried (but live within the deadline); neither once polling stops past ``stall_s``."""
    import threading

    topic = make_topic(kafka_conf, f"t-health-{unique}", partitions=1)
    job = f"health-{unique}"
    store_down = threading.Event()
    store_down.set()
    sink = KafkaSink(
        lambda: Borrowed(store, lambda: store_down.is_set() and refuse()),
        kafka_conf,
        topics={topic: STEPS},
        group=f"g-{unique}",
        batch_seconds=0.2,
        max_backoff_s=0.3,
        retry_deadline_s=60,
        stall_s=5,
    )
    try:
        assert sink.readiness() == (False, "not in the consumer group yet (no partition assignment)")
        assert sink.liveness() == (True, "starting")
        _poll_until(
            sink, lambda: sink.readiness()[1] != "not in the consumer group yet (no partition assignment)"
        )
        assert sink.readiness() == (False, "ClickHouse has not answered yet")

        produce(kafka_conf, topic, batches(job, 2))
        _poll_until(sink, lambda: sink.stats.store_down_since is not None)
        ready, why = sink.readiness()
        assert not ready and why.startswith("ClickHouse unavailable for")
        live, why = sink.liveness()
        assert live and why.startswith("retrying ClickHouse")
        down_since = sink.stats.store_down_since
        assert down_since is not None
        # past the retry deadline (the sink should have failed by then): not live
        live, why = sink.liveness(now=down_since + 60 + 5 + 1)
        assert not live and "past the 60 s deadline" in why

        store_down.clear()
        _poll_until(sink, lambda: count(store, "steps", job) == 16 and sink.readiness()[0])
        ready, why = sink.readiness()
        assert ready and why.startswith("ready: 1 partition(s) assigned"), why
        assert sink.liveness()[0]
        # nobody polls for longer than stall_s: neither live nor ready
        later = time.monotonic() + 6
        assert sink.liveness(now=later)[0] is False and "no poll for" in sink.liveness(now=later)[1]
        assert sink.readiness(now=later) == (False, "the consumer is not polling")
    finally:
        sink.close()
    assert sink.readiness() == (False, "stopped") and sink.liveness() == (False, "stopped")


def test_an_insert_that_hangs_fails_liveness(kafka_conf, store, unique) -> None:
    import threading

    topic = make_topic(kafka_conf, f"t-hang-{unique}", partitions=1)
    job = f"hang-{unique}"
    entered, release = threading.Event(), threading.Event()

    def hang() -> None:
        entered.set()
        release.wait(60)

    sink = KafkaSink(
        lambda: Borrowed(store, hang),
        kafka_conf,
        topics={topic: STEPS},
        group=f"g-{unique}",
        batch_seconds=0.2,
        stall_s=5,
    )
    try:
        produce(kafka_conf, topic, batches(job, 1))
        _poll_until(sink, entered.is_set)
        assert sink.liveness()[0]  # an insert in progress within stall_s is fine
        live, why = sink.liveness(now=time.monotonic() + 6)
        assert not live and why.startswith("an insert has run for"), why
        release.set()
        _poll_until(sink, lambda: count(store, "steps", job) == 8)
        sink.poll(0.2)
        assert sink.liveness(now=time.monotonic() + 1)[0]
    finally:
        release.set()
        sink.close()


def _marked(record: Any, mark: str) -> Any:
    """The record with ``mark`` where its table keeps who it is (job, host or topic)."""
    for name in ("job", "host", "topic"):
        if hasattr(record, name):
            if isinstance(record, StepBatch):
                return StepBatch(mark, record.run, record.step, record.columns)
            return dataclasses.replace(record, **{name: mark})
    raise AssertionError(type(record).__name__)


_MARK_COLUMN = {"gpu_samples": "host", "dead_letters": "topic"}


def test_each_topic_stores_only_its_own_records_and_size_bombs_are_dead_lettered(
    kafka_conf, store, unique
) -> None:
    """Issue 34, items 4 and 2: the sink picked the table from the record's type, not its
    topic (an Anomaly on argus.steps, which every rank may write, was stored as a page, a
    StepSummary on argus.kernels, a DeadLetter on argus.gpu...). Every record type is sent
    on every topic the sink reads, with a claimed-size bomb per topic: each topic stores
    its own records, every other one and every bomb is dead-lettered, the sink lives."""
    from argus.schemas import SCHEMAS, TOPIC_SCHEMAS
    from argus.sinks.kafka_sink import SINK_TOPICS
    from argus.sinks.rows import TABLE_OF
    from tests.records import RECORDS, WORKER_RECORDS
    from tests.security.bombs import bombs

    kinds = [step_batch(4, step=7), *RECORDS, *WORKER_RECORDS]
    schema_of = {info.record_type: info.name for info in SCHEMAS.values()}
    carries = {make_topic(kafka_conf, f"t-forge{i}-{unique}"): argus for i, argus in enumerate(SINK_TOPICS)}
    p = Producer({**kafka_conf, "enable.idempotence": True, "linger.ms": 5})
    own = forged = bombed = 0
    expected: dict[str, int] = {}
    for i, (topic, argus) in enumerate(carries.items()):
        mark = f"fg{i}-{unique}"
        for record in kinds:
            p.produce(topic, key=mark.encode(), value=encode(_marked(record, mark), check=False))
            if schema_of[type(record)] in TOPIC_SCHEMAS[argus]:
                own += 1
                table, rows = to_arrow([_marked(record, mark)])
                expected[f"{table}:{mark}"] = expected.get(f"{table}:{mark}", 0) + rows.num_rows
            else:
                forged += 1
        for bomb_topic, _what, message in bombs():
            if bomb_topic == argus:
                p.produce(topic, key=mark.encode(), value=message)
                bombed += 1
    assert p.flush(30) == 0
    total = len(carries) * len(kinds) + bombed
    sink = KafkaSink(
        lambda: Borrowed(store), kafka_conf, topics=carries, group=f"g-{unique}", batch_seconds=0.2
    )
    try:
        deadline = time.monotonic() + 90
        while sink.stats.messages < total and time.monotonic() < deadline:
            sink.poll(0.3)
        sink.flush_all()
    finally:
        sink.close()
    stored: dict[str, int] = {}
    for table in sorted(set(TABLE_OF.values())):
        column = _MARK_COLUMN.get(table, "job")
        for mark, n in store.query_rows(
            f"SELECT {column}, count() FROM {table} WHERE {column} LIKE {{m:String}} GROUP BY {column}",
            {"m": f"fg%-{unique}"},
        ):
            stored[f"{table}:{mark}"] = n
    forged_stored = sum(n - expected.get(k, 0) for k, n in stored.items() if n > expected.get(k, 0))
    reasons = dict(
        store.query_rows(
            "SELECT reason, count() FROM dead_letters WHERE topic LIKE {t:String} GROUP BY reason",
            {"t": f"t-forge%-{unique}"},
        )
    )
    report(
        "forged + size bombs",
        sent=total,
        received=sink.stats.messages,
        hostile_records=forged + bombed,
        dead_lettered=sink.stats.dead_letters,
        forged_stored=forged_stored,
        bombs=bombed,
        own_records=own,
    )
    assert sink.stats.messages == total
    assert stored == expected
    assert reasons.get("wrong_topic") == forged
    assert sum(reasons.values()) == forged + bombed == sink.stats.dead_letters


def rollup_counts(store: Any, job: str) -> dict[str, int]:
    """Rows of a job as ``steps FINAL`` holds them and as each rollup counts them."""
    p = {"j": job}

    def one(sql: str) -> int:
        return int(store.query_rows(sql, p)[0][0] or 0)

    return {
        "steps_final": one("SELECT count() FROM steps FINAL WHERE job = {j:String}"),
        "steps": one("SELECT count() FROM steps WHERE job = {j:String}"),
        "steps_minutely": one("SELECT sum(rows) FROM steps_minutely WHERE job = {j:String}"),
        "steps_rank_minutely": one("SELECT sum(steps) FROM steps_rank_minutely WHERE job = {j:String}"),
        "steps_by_rank": one("SELECT sum(steps) FROM steps_by_rank WHERE job = {j:String}"),
        "summaries_final": one("SELECT count() FROM step_summaries FINAL WHERE job = {j:String}"),
        "summaries": one("SELECT count() FROM step_summaries WHERE job = {j:String}"),
    }


def rollup_excess(counts: dict[str, int]) -> int:
    """Rows counted beyond ``steps FINAL`` (and summaries beyond ``step_summaries FINAL``)."""
    steps = max(counts[k] for k in ("steps", "steps_minutely", "steps_rank_minutely", "steps_by_rank"))
    return steps - counts["steps_final"] + counts["summaries"] - counts["summaries_final"]


def _summary(job: str, step: int) -> Any:
    from tests.records import RECORDS

    s = next(r for r in RECORDS if type(r).__name__ == "StepSummary")
    return dataclasses.replace(s, job=job, step=step, end_ns=T0 + step * 10**9)


def test_rollups_count_each_row_once_after_a_re_cut_redelivery_and_a_producer_retry(
    kafka_conf, store, unique
) -> None:
    """Issue 34, item 5: a sink that lost its group membership had inserted offsets 0..5 in
    one batch without committing them (no intent either); its successor re-reads them and
    cuts other batches (new tokens): steps_minutely, steps_rank_minutely and steps_by_rank
    counted them twice for good, step_summaries held 2 rows of a step. A rank that re-sent
    its step (a producer retry) was counted twice as well. Rollups equal ``steps FINAL``."""
    from argus.schemas import STEP_SUMMARIES

    topic = make_topic(kafka_conf, f"t-redeliver-{unique}", partitions=1)
    sums = make_topic(kafka_conf, f"t-redeliver-sums-{unique}", partitions=1)
    job = f"redeliver-{unique}"
    recs = batches(job, 10)
    retried = [recs[4].take([3]), recs[7], recs[7].take([0, 1])]  # a rank's, a node's message again
    produce(kafka_conf, topic, [*recs, *retried])
    summaries = [_summary(job, s) for s in range(10)]
    produce(kafka_conf, sums, [*summaries, summaries[2], summaries[9]])
    table, data = to_arrow(recs[:6])
    store.insert_arrow(table, data, settings=dedup_settings(f"steps:{topic}:0:0-5"))  # the lost sink's batch
    table, data = to_arrow(summaries[:3])
    store.insert_arrow(table, data, settings=dedup_settings(f"step_summaries:{sums}:0:0-2"))
    sink = KafkaSink(
        lambda: Borrowed(store),
        kafka_conf,
        topics={topic: STEPS, sums: STEP_SUMMARIES},
        group=f"g-{unique}",
        batch_rows=20,
        batch_seconds=0.05,
        max_poll_messages=3,
    )
    try:
        deadline = time.monotonic() + 60
        while sink.stats.messages < 13 + 12 and time.monotonic() < deadline:
            sink.poll(0.2)
        sink.flush_all()
    finally:
        sink.close()
    counts = rollup_counts(store, job)
    report(
        "rollups after a redelivery",
        sent=80,
        received=counts["steps_final"],
        rollup_excess=rollup_excess(counts),
    )
    assert counts == {
        "steps_final": 80,
        "steps": 80,
        "steps_minutely": 80,
        "steps_rank_minutely": 80,
        "steps_by_rank": 80,
        "summaries_final": 10,
        "summaries": 10,
    }
    assert sink.stats.redelivered == {"steps": 48 + 11, "step_summaries": 3 + 2}


@pytest.mark.slow
def test_rollups_stay_exact_through_a_broker_outage_and_producer_retries(store, tmp_path, unique) -> None:
    """Issue 34, item 5, live: a broker of our own is stopped for ``ARGUS_TEST_ROLLUP_OUTAGE_S``
    (60 s in the bench) while the real Publisher sends 8 ranks at 5 steps/s and the sink
    runs; the agents spool and replay, the sink loses its group and re-reads, and ranks
    re-send steps (producer retries). Every rollup equals ``steps FINAL``."""
    import subprocess
    import threading
    from pathlib import Path

    from argus.producers.publisher import Publisher

    repo = Path(__file__).resolve().parents[2]
    port = int(os.environ.get("ARGUS_TEST_ROLLUP_PORT", "19394"))
    outage_s = float(os.environ.get("ARGUS_TEST_ROLLUP_OUTAGE_S", "10"))
    env = {**os.environ, "ARGUS_KAFKA_PORT": str(port), "ARGUS_KAFKA_DATA": str(tmp_path / "kafka")}

    def kafka(action: str) -> None:
        subprocess.run([str(repo / "scripts" / "kafka.sh"), action], env=env, check=True, timeout=180)

    conf = {"bootstrap.servers": f"127.0.0.1:{port}"}
    job = f"outage-rollup-{unique}"
    kafka("up")
    stop_sink, stop_ranks = threading.Event(), threading.Event()
    try:
        ensure_topics(conf, [STEPS], partitions=4)
        publisher = Publisher(conf, spool_dir=tmp_path / "spool", stall_s=1.0)
        sink = KafkaSink(
            lambda: Borrowed(store), conf, topics=[STEPS], group=f"g-{unique}", batch_seconds=0.5
        )
        sinking = threading.Thread(target=sink.run, args=(stop_sink,))
        sinking.start()
        template = step_batch(8, step=0)
        sent: list[StepBatch] = []

        def ranks() -> None:  # 8 ranks at 5 steps/s, one message per rank and step
            step = 0
            while not stop_ranks.is_set():
                cols = dict(template.columns)
                cols["start_ns"] = np.full(8, time.time_ns() - 150_000_000)
                cols["end_ns"] = cols["start_ns"] + 120_000_000
                whole = StepBatch(job, 1, step, cols)
                for r in range(8):
                    publisher.publish(STEPS, step_key(job, step), whole.take([r]))
                sent.append(whole)
                step += 1
                stop_ranks.wait(0.2)

        ranking = threading.Thread(target=ranks)
        ranking.start()
        time.sleep(5)
        kafka("down")
        time.sleep(outage_s)
        kafka("up")
        time.sleep(10)
        stop_ranks.set()
        ranking.join()
        for whole in sent[:: max(1, len(sent) // 10)]:  # retries: a rank's step sent again
            publisher.publish(STEPS, step_key(job, whole.step), whole.take([whole.step % 8]))
        assert publisher.flush(120) == 0
        stats = publisher.stats()
        publisher.shutdown()
        want = 8 * len(sent)
        deadline = time.monotonic() + 120
        while rollup_counts(store, job)["steps_final"] < want and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(3)  # the sink's last batches
    finally:
        stop_ranks.set()
        stop_sink.set()
        with contextlib.suppress(NameError):
            sinking.join(60)
        kafka("down")
    counts = rollup_counts(store, job)
    report(
        "broker outage, rollups",
        sent=want,
        received=counts["steps_final"],
        lost=want - counts["steps_final"],
        rollup_excess=rollup_excess(counts),
        outage_s=outage_s,
        spooled=stats.get("spooled", 0),
        redelivered=sum(sink.stats.redelivered.values()),
    )
    assert counts["steps_final"] == want
    assert rollup_excess(counts) == 0, counts
