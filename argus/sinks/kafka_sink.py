"""Kafka → ClickHouse, exactly once.

The sink reads the topics in per-partition batches (``batch_rows`` rows or
``batch_seconds``, whichever comes first) and inserts each batch as Arrow. Exactly-once
without transactions across Kafka and ClickHouse works like this, per partition:

1. commit the batch's first offset with the metadata ``argus:<last offset>`` (an intent);
2. insert with ``insert_deduplication_token = table:topic:partition:first-last``;
3. commit ``last + 1``.

A sink that dies between 1 and 3 leaves the intent behind; whichever sink gets the
partition next reads it on assignment and cuts its first batch at exactly the same
offsets — however librdkafka chunks the messages this time: the replayed batch is cut at
the recorded last offset and nowhere else, never by size or age, and a partition revoked
mid-replay is left to its next owner — so the retried insert carries the same token and
ClickHouse drops it (and what its materialized views would add) if it had landed.

Only an unavailable store (:class:`StoreUnavailableError`: unreachable, or a transient
server condition) is retried: jittered, capped backoff, for at most ``retry_deadline_s``
(then the sink fails and the batch is replayed by the next sink), cut short by a stop.
The partitions are paused meanwhile so the consumer stays in its group. An insert the
store *rejects* (:class:`QueryError`: the same data would fail again, e.g. one record
spanning more days than ClickHouse takes partitions per insert) is split in halves,
each with its own deterministic token, down to the one record that fails, which goes to
``dead_letters`` with the store's reason. Bad input never stops the sink: it lands in
``dead_letters`` with the reason (a bounded :meth:`DeadLetter.of`).

Health (:meth:`KafkaSink.readiness`, :meth:`KafkaSink.liveness`, served by ``argus sink`` for
the kubelet): ready once the consumer is in its group (partitions assigned, possibly none),
polling, and the store has answered; live while the consumer polls and the writer's insert
is within ``stall_s``, or while the store is being retried within ``retry_deadline_s``.

The consumer thread commits the intents and the offsets; the inserts (step 2) run on one
writer thread, so the next batches are decoded while ClickHouse inserts (its insert
releases the GIL). A partition has one batch at the writer at a time (its commits stay in
order); its next batch grows meanwhile, up to ``max_pending_rows``, then the consumer
pauses its partitions until the write is done.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Message, TopicPartition

from argus.schemas import (
    ANOMALIES,
    DEAD_LETTER,
    GPU_SAMPLES,
    KERNELS,
    SCHEMAS,
    STACKS,
    STEP_SUMMARIES,
    STEPS,
    TOPIC_SCHEMAS,
    DeadLetter,
    KernelNames,
    KernelSketch,
    SchemaError,
    StepBatch,
    decode_many,
    peek_schema_id,
)

from ._errors import QueryError, SinkError
from ._redelivery import ROLLUP_KEYS, fresh_rows, kept_records
from ._retrying import RetryingStore, Stopped
from .kernels import KernelDecoder
from .rows import TABLE_OF, to_arrow
from .store import Store, dedup_settings

__all__ = ["SINK_TOPICS", "KafkaSink", "SinkStats"]

log = logging.getLogger("argus.sink")

SINK_TOPICS = (STEPS, KERNELS, STACKS, GPU_SAMPLES, STEP_SUMMARIES, ANOMALIES, DEAD_LETTER)
_INTENT = "argus:"


@dataclass
class SinkStats:
    """Counters since the sink started (read by the metrics endpoint and tests)."""

    messages: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0
    inserts: int = 0
    insert_retries: int = 0
    rejected: int = 0
    """Records the store rejected (dead-lettered with its reason)."""
    redelivered: dict[str, int] = field(default_factory=dict)
    """Rows not inserted because the store holds them already, per table: a redelivery
    (a batch re-cut after a lost group membership) or a producer's retry."""
    store_down_since: float | None = None


@dataclass
class _Pending:
    first: int
    last: int = -1
    rows: int = 0
    since: float = field(default_factory=time.monotonic)
    records: list[Any] = field(default_factory=list)
    sources: list[tuple[int, int, bytes]] = field(default_factory=list)  # offset, time ns, bytes per record


def _rows_of(record: Any) -> int:
    return len(record) if isinstance(record, StepBatch) else 1


class KafkaSink:
    """Consume Argus topics into a ClickHouse store, exactly once per record."""

    def __init__(
        self,
        open_store: Callable[[], Store],
        kafka_config: dict[str, Any],
        *,
        topics: Iterable[str] | Mapping[str, str] = SINK_TOPICS,
        group: str = "argus-sink",
        batch_rows: int = 5000,
        batch_seconds: float = 1.0,
        max_backoff_s: float = 5.0,
        max_pending_rows: int = 250_000,
        retry_deadline_s: float = 600.0,
        max_poll_messages: int = 2000,
        stall_s: float = 120.0,
    ) -> None:
        if batch_rows <= 0 or batch_seconds <= 0 or stall_s <= 0:
            raise ValueError("batch_rows, batch_seconds and stall_s must be positive")
        # Each topic consumed stands for an Argus topic, whose records alone it may store.
        self._carries = dict(topics) if isinstance(topics, Mapping) else {t: t for t in topics}
        unknown = sorted(t for t in self._carries.values() if t not in TOPIC_SCHEMAS)
        if unknown:
            raise ValueError(f"not Argus topics (name the one each stands for): {unknown}")
        self.stats = SinkStats()
        self._batch_rows = batch_rows
        self._batch_seconds = batch_seconds
        self._max_poll = max(1, max_poll_messages)
        self._stall_s = stall_s
        # health, written by the consumer and writer threads, read by the probes' thread
        self._assigned: int | None = None  # partitions held; None: not in the group
        self._last_poll: float | None = None
        self._insert_since: float | None = None  # the writer's batch in progress
        self._stopping = threading.Event()
        self._stop: threading.Event | None = None
        self._db = RetryingStore(
            open_store,
            self.stats,
            max_backoff_s=max_backoff_s,
            retry_deadline_s=retry_deadline_s,
            stopping=self._stopping,
            stopped=self._stopped,
        )
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._replay_end: dict[tuple[str, int], int] = {}
        self._backlog: list[Message] = []
        self._kernels = KernelDecoder(self._stored_names)  # used on the writer thread only
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="argus-sink-writer")
        self._writes: deque[tuple[tuple[str, int], _Pending, Future[None]]] = deque()
        self._max_pending_rows = max(batch_rows, max_pending_rows)
        conf = dict(kafka_config)
        conf.update(
            {
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "enable.partition.eof": False,
            }
        )
        self._consumer = Consumer(conf, logger=logging.getLogger("argus.sink.kafka"))
        self._consumer.subscribe(list(self._carries), on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _stored_names(self, key: tuple[str, int, int]) -> dict[int, str]:
        """A rank's kernel names from the store (after a restart the dictionary is not resent)."""
        if self._db.store is None:
            return {}
        try:
            rows = self._db.store.query_rows(
                "SELECT kernel_id, any(name) FROM kernel_names WHERE job = {j:String} AND run = {r:UInt32} "
                "AND rank = {k:UInt32} GROUP BY kernel_id",
                {"j": key[0], "r": key[1], "k": key[2]},
            )
        except SinkError:
            return {}
        return {int(i): str(n) for i, n in rows}

    # -- partition assignment -------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assigned = len(partitions)
        for tp in consumer.committed(partitions, timeout=10):
            meta = tp.metadata or ""
            if meta.startswith(_INTENT) and tp.offset != OFFSET_INVALID:
                self._replay_end[(tp.topic, tp.partition)] = int(meta[len(_INTENT) :])
                log.info(
                    "replaying %s[%d] %d..%s after an unfinished insert",
                    tp.topic,
                    tp.partition,
                    tp.offset,
                    meta[len(_INTENT) :],
                )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Every batch of these partitions is stored and committed before they go.
        self._assigned = None
        self._drain()
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if key in self._replay_end:
                # A replay not yet at its recorded end: cut here it would get a new token.
                # Its intent stays committed; the partition's next owner replays it whole.
                self._pending.pop(key, None)
            elif key in self._pending:
                self._flush(key)
            self._replay_end.pop(key, None)
        self._drain()

    # -- the loop -------------------------------------------------------------------------
    def run(self, stop: threading.Event, *, idle_exit_s: float | None = None) -> SinkStats:
        """Consume until ``stop`` is set (or nothing arrived for ``idle_exit_s``), then flush."""
        last_message = time.monotonic()
        self._stop = stop
        try:
            while not stop.is_set():
                got = self.poll(timeout=0.2)
                now = time.monotonic()
                if got:
                    last_message = now
                elif (
                    idle_exit_s is not None
                    and now - last_message > idle_exit_s
                    and not self._pending
                    and not self._writes
                ):
                    break
            self.flush_all()
        except Stopped:
            log.warning(
                "stopped while ClickHouse was unavailable: the batches not stored are replayed "
                "on the next start (their intents are committed)"
            )
        finally:
            self.close()
        return self.stats

    def poll(self, timeout: float = 0.2) -> int:
        """Consume what is there, flush the batches that are due; return messages read."""
        self._last_poll = time.monotonic()
        self._reap()
        messages, self._backlog = self._backlog, []
        messages.extend(self._consumer.consume(num_messages=self._max_poll, timeout=timeout))
        usable = []
        for msg in messages:
            if not self._usable(msg):
                continue
            misplaced = self._misplaced(msg)
            if misplaced is None:
                usable.append(msg)
            else:  # never decoded: a forged record costs its header
                self._accept(msg, self._dead(msg, "wrong_topic", misplaced))
        # One decode for the whole consumer batch: its StepBatches are checked in one pass.
        for msg, record in zip(usable, decode_many([m.value() or b"" for m in usable]), strict=True):
            self._accept(msg, record)
        now = time.monotonic()
        for key, p in list(self._pending.items()):
            if key in self._replay_end:
                continue  # a replay ends at its recorded offset, nowhere else (_accept cuts it)
            due = p.rows >= self._batch_rows or now - p.since >= self._batch_seconds
            if due and (not self._writing(key) or p.rows >= self._max_pending_rows):
                self._flush(key)
        return len(messages)

    def _usable(self, msg: Message) -> bool:
        """False for a consumer event that is not a message (logged); fatal errors raise."""
        err = msg.error()
        if err is None:
            return True
        if err.fatal():
            raise SinkError(f"Kafka consumer failed: {err}")
        log.warning("Kafka: %s", err)
        return False

    def _misplaced(self, msg: Message) -> str | None:
        """Why the message's record does not belong on its topic (a known schema of a record
        the topic does not carry: an Anomaly on argus.steps is forged), or None."""
        try:
            info = SCHEMAS.get(peek_schema_id(msg.value() or b""))
        except SchemaError:
            return None  # not a record at all: the decoder names why
        allowed = TOPIC_SCHEMAS[self._carries[str(msg.topic())]]
        if info is None or info.name in allowed:
            return None
        return (
            f"a {info.record_type.__name__} on {msg.topic()}, which carries only {', '.join(sorted(allowed))}"
        )

    def _accept(self, msg: Message, record: Any) -> None:
        topic, partition, offset = str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0)
        key = (topic, partition)
        self.stats.messages += 1
        if isinstance(record, SchemaError):
            record = self._dead(msg, record.reason, str(record))
        elif type(record) not in TABLE_OF:
            record = self._dead(msg, "unexpected_type", f"{type(record).__name__} is not stored")
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(first=offset)
        pending.records.append(record)
        pending.sources.append((offset, self._time_ns(msg), msg.value() or b""))
        pending.last = offset
        pending.rows += _rows_of(record)
        replay_end = self._replay_end.get(key)
        if replay_end is not None and offset >= replay_end:
            self._flush(key)  # the replayed batch ends exactly where the unfinished one did
            self._replay_end.pop(key, None)

    @staticmethod
    def _time_ns(msg: Message) -> int:
        _, ts_ms = msg.timestamp()
        return max(ts_ms, 0) * 1_000_000

    def _dead(self, msg: Message, reason: str, error: str) -> DeadLetter:
        self.stats.dead_letters += 1
        log.warning("dead letter from %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), error[:200])
        return DeadLetter.of(
            str(msg.topic()),
            int(msg.partition() or 0),
            int(msg.offset() or 0),
            reason,
            error,
            self._time_ns(msg),
            msg.value() or b"",
        )

    # -- inserting ------------------------------------------------------------------------
    def flush_all(self) -> None:
        """Insert every pending batch now and wait until all are stored and committed (a
        replay not yet at its recorded end is left to the next start)."""
        self._drain()
        for key in list(self._pending):
            if key in self._replay_end:
                self._pending.pop(key)
            else:
                self._flush(key)
        self._drain()

    def _flush(self, key: tuple[str, int]) -> None:
        """Cut the partition's batch: commit its intent, hand the insert to the writer."""
        if self._writing(key):
            self._wait_for(key)
        pending = self._pending.pop(key, None)
        if pending is None or not pending.records:
            return
        topic, partition = key
        self._commit(topic, partition, pending.first, f"{_INTENT}{pending.last}")
        self._writes.append((key, pending, self._writer.submit(self._insert_batch, key, pending)))

    def _finish(self, key: tuple[str, int], pending: _Pending, write: Future[None]) -> None:
        write.result()  # blocks until stored; a writer failure (fatal) is raised here
        self._commit(key[0], key[1], pending.last + 1, "")

    def _writing(self, key: tuple[str, int]) -> bool:
        """The partition has a batch at the writer (at most a few partitions ever do)."""
        return any(k == key for k, _, _ in self._writes)

    def _reap(self) -> None:
        """Commit the batches the writer finished, in the order they were cut."""
        while self._writes and self._writes[0][2].done():
            self._finish(*self._writes.popleft())

    def _drain(self) -> None:
        """Wait for every write (without consuming: also called from rebalance callbacks)."""
        while self._writes:
            self._finish(*self._writes.popleft())

    def _wait_for(self, key: tuple[str, int]) -> None:
        """Keep the consumer in its group, partitions paused, until ``key``'s write is done."""
        assignment = self._consumer.assignment()
        self._consumer.pause(assignment)
        try:
            while self._writing(key):
                # A message fetched before the pause is kept for the next poll, not lost.
                self._backlog.extend(self._consumer.consume(num_messages=100, timeout=0.1))
                self._last_poll = time.monotonic()
                self._reap()
        finally:
            self._consumer.resume(assignment)

    def _insert_batch(self, key: tuple[str, int], pending: _Pending) -> None:
        """Step 2 of the module docstring for one batch (on the writer thread)."""
        self._insert_since = time.monotonic()
        try:
            self._insert_kinds(key, pending)
        finally:
            self._insert_since = None

    def _insert_kinds(self, key: tuple[str, int], pending: _Pending) -> None:
        topic, partition = key
        by_type: dict[type, list[int]] = {}
        decoded: list[pa.Table] = []
        for i, record in enumerate(pending.records):  # in partition order: names arrive before their sketches
            by_type.setdefault(type(record), []).append(i)
            if isinstance(record, KernelNames):
                self._kernels.names(record)
            elif isinstance(record, KernelSketch):
                rows = self._kernels.decode(record)
                if rows is not None:
                    decoded.append(rows)
        base = f"{topic}:{partition}:{pending.first}-{pending.last}"
        for kind, index in by_type.items():
            token = f"{TABLE_OF[kind]}:{base}"
            if kind in ROLLUP_KEYS:
                index, token = self._unstored(pending, index, token)
            if index:
                self._insert_records(key, pending, index, token)
        if decoded:
            data = pa.concat_tables(decoded)
            try:
                self._insert_with_retry("kernels", data, f"kernels:{base}")
            except QueryError as exc:  # derived rows: their sketches are stored; log, count, go on
                self.stats.rejected += data.num_rows
                log.error("the store rejected %d decoded kernel rows of %s: %s", data.num_rows, base, exc)
            else:
                self.stats.rows["kernels"] = self.stats.rows.get("kernels", 0) + data.num_rows

    def _unstored(self, pending: _Pending, index: list[int], token: str) -> tuple[list[int], str]:
        """The records at ``index`` (one keyed type) less the rows the store holds already
        and the rows an earlier record of the batch holds (a partial StepBatch is cut in
        ``pending.records``): the materialized rollups count what is inserted, so a row is
        inserted once, whatever Kafka redelivers. Returns the index left and its token: the
        batch's own when nothing was dropped, else one named after the rows kept (a replay
        drops the same rows, or all of them once this insert landed)."""
        records = [pending.records[i] for i in index]
        keep = fresh_rows(records, self._db)
        dropped = sum(int((~k).sum()) for k in keep)
        if not dropped:
            return index, token
        table = ROLLUP_KEYS[type(records[0])][0]
        self.stats.redelivered[table] = self.stats.redelivered.get(table, 0) + dropped
        log.info(
            "%d rows of %s are in %s already (redelivered or resent): not inserted again",
            dropped,
            token,
            table,
        )
        left, token = kept_records(records, keep, token)
        for j, kept in left:
            pending.records[index[j]] = kept
        return [index[j] for j, _ in left], token

    def _insert_records(self, key: tuple[str, int], pending: _Pending, index: list[int], token: str) -> None:
        """Insert records of one type; a rejected insert is split in halves (deterministic
        tokens: a replay splits the same way), a rejected single record dead-lettered."""
        records = [pending.records[i] for i in index]
        try:
            table, data = to_arrow(records)
        except (pa.ArrowException, OverflowError, ValueError, TypeError, MemoryError) as exc:
            error: Exception = QueryError(f"not convertible to the table's columns: {exc}")
        else:
            try:
                self._insert_with_retry(table, data, token)
            except QueryError as exc:
                error = exc
            else:
                self.stats.rows[table] = self.stats.rows.get(table, 0) + data.num_rows
                return
        if len(index) > 1:
            mid = len(index) // 2
            for part in (index[:mid], index[mid:]):
                self._insert_records(key, pending, part, f"{token.split('/')[0]}/{part[0]}-{part[-1]}")
            return
        self._reject(key, pending, index[0], str(error))

    def _reject(self, key: tuple[str, int], pending: _Pending, i: int, error: str) -> None:
        """Dead-letter the one record the store rejected, with the store's reason."""
        offset, time_ns, raw = pending.sources[i]
        self.stats.rejected += 1
        log.error("the store rejected the record at %s[%d]@%d: %s", key[0], key[1], offset, error[:300])
        if isinstance(pending.records[i], DeadLetter):
            log.error("the rejected record is a dead letter itself: dropped")
            return
        letter = DeadLetter.of(key[0], key[1], offset, "rejected", error, time_ns, raw)
        table, data = to_arrow([letter])
        try:
            self._insert_with_retry(table, data, f"{table}:{key[0]}:{key[1]}:{offset}:rejected")
        except QueryError as exc:
            log.error("its dead letter was rejected too (%s): dropped", exc)
            return
        self.stats.dead_letters += 1
        self.stats.rows[table] = self.stats.rows.get(table, 0) + 1

    def _commit(self, topic: str, partition: int, offset: int, metadata: str) -> None:
        tp = TopicPartition(topic, partition, offset, metadata=metadata)
        try:
            self._consumer.commit(offsets=[tp], asynchronous=False)
        except KafkaException as exc:
            # A failed commit only means a replay later; the insert tokens make it harmless.
            if exc.args and isinstance(exc.args[0], KafkaError) and exc.args[0].fatal():
                raise SinkError(f"offset commit failed fatally: {exc}") from exc
            log.warning("offset commit for %s[%d] failed (%s); it will be replayed", topic, partition, exc)

    def _stopped(self) -> bool:
        return self._stopping.is_set() or (self._stop is not None and self._stop.is_set())

    def _insert_with_retry(self, table: str, data: Any, token: str) -> None:
        """Insert, retrying only while the store is unavailable (:meth:`RetryingStore.call`)."""
        self._db.call(
            f"insert into {table}",
            lambda store: store.insert_arrow(table, data, settings=dedup_settings(token)),
        )
        self.stats.inserts += 1

    # -- health -----------------------------------------------------------------------------
    def store_answered(self) -> None:
        """Record that the store answered outside the sink (e.g. the migrations at start)."""
        self._db.answered = time.monotonic()

    def readiness(self, now: float | None = None) -> tuple[bool, str]:
        """Ready: in the consumer group (partitions assigned, possibly none), polling within
        ``stall_s``, and the store answered and is not being retried. Returns (ready, why)."""
        now = time.monotonic() if now is None else now
        if self._stopping.is_set():
            return False, "stopped"
        if self._assigned is None:
            return False, "not in the consumer group yet (no partition assignment)"
        if self._last_poll is None or now - self._last_poll > self._stall_s:
            return False, "the consumer is not polling"
        if self.stats.store_down_since is not None:
            return False, f"ClickHouse unavailable for {now - self.stats.store_down_since:.0f} s (retrying)"
        if self._db.answered is None:
            return False, "ClickHouse has not answered yet"
        return True, (
            f"ready: {self._assigned} partition(s) assigned, polled {now - self._last_poll:.1f} s ago, "
            f"ClickHouse answered {now - self._db.answered:.0f} s ago"
        )

    def liveness(self, now: float | None = None) -> tuple[bool, str]:
        """Live: the consumer polled within ``stall_s`` and the insert in progress (if any) is
        younger than ``stall_s``; or the store is being retried within ``retry_deadline_s``
        (the consumer may wait on the writer then). Before the first poll: live (starting).
        Returns (live, why)."""
        now = time.monotonic() if now is None else now
        if self._stopping.is_set():
            return False, "stopped"
        down_since = self.stats.store_down_since
        if down_since is not None:
            down = now - down_since
            if down > self._db.retry_deadline_s + self._stall_s:
                return (
                    False,
                    f"ClickHouse retried for {down:.0f} s, past the {self._db.retry_deadline_s:.0f} s deadline",
                )
            return True, f"retrying ClickHouse for {down:.0f} s (deadline {self._db.retry_deadline_s:.0f} s)"
        insert_since = self._insert_since
        if insert_since is not None and now - insert_since > self._stall_s:
            return False, f"an insert has run for {now - insert_since:.0f} s (limit {self._stall_s:.0f} s)"
        if self._last_poll is None:
            return True, "starting"
        if now - self._last_poll > self._stall_s:
            return False, f"no poll for {now - self._last_poll:.0f} s (limit {self._stall_s:.0f} s)"
        return True, f"polled {now - self._last_poll:.1f} s ago"

    def close(self) -> None:
        """Leave the consumer group and release the store (after the writes in progress;
        a write waiting for an unavailable store gives up at once)."""
        self._stopping.set()
        self._writer.shutdown(wait=True)
        self._writes.clear()
        with contextlib.suppress(RuntimeError):  # already closed
            self._consumer.close()
        self._db.drop()
