"""The Kafka edge of the producers: a bounded queue, one background thread, a disk spool.

The only module of ``producers`` that imports confluent_kafka. The caller's thread only
appends to a bounded in-memory queue (``publish`` costs a few hundred nanoseconds and never
raises); one worker thread encodes, hands records to librdkafka (idempotent, lz4,
infinite delivery timeout so that librdkafka itself never drops), serves delivery reports
and watches for a stalled broker.

Broker outage: when records in flight see no delivery progress for ``stall_s`` (or
librdkafka reports every broker down), new records go to the :class:`~producers.spool.Spool`
on disk instead; once deliveries progress again the spool is replayed from its head before
anything newer is sent, so records stay in the order they were published (per key, per
partition). Shutdown (OpenTelemetry ``BatchProcessor`` style) has one deadline for all of
it: stop intake, let the worker deliver, then spool whatever is left (queue and in flight).
Everything not delivered and not spooled is counted in ``dropped`` with its reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from functools import partial
from pathlib import Path
from typing import Any

from argus.schemas import Record, SchemaError, StepBatch, encode, valid_steps

from ._errors import KafkaSettingsError, PublishError
from ._priority import yield_cpu_to_training
from .relay import RELAYED_TOPICS, RelayClient
from .spool import Spool, SpoolRecord

__all__ = ["KafkaSettingsError", "PublishError", "Publisher"]

log = logging.getLogger("argus.publisher")

_UNKNOWN = frozenset({-188, -190, 3})
"""librdkafka's _UNKNOWN_TOPIC, _UNKNOWN_PARTITION and the broker's UNKNOWN_TOPIC_OR_PART."""
UNKNOWN_TOPIC_WAIT_S = 60.0
"""How long records are kept for a topic or partition the broker does not know yet."""

_Item = tuple[str, bytes, "Record | bytes"]

GIL_HOLD_S = 0.001
"""How long the worker works through a round before it lets the training thread have the
GIL (a bounded wait for it, not CPython's 5 ms switch interval)."""


def _yield_gil(since: float) -> float:
    """Yield the GIL if it was held since ``since`` for longer than ``GIL_HOLD_S``: each
    yield costs a handover (tens of µs on a busy host), so not after every few records."""
    now = time.perf_counter()
    if now - since < GIL_HOLD_S:
        return since
    time.sleep(0)
    return time.perf_counter()


class Publisher:
    """Publish Argus records to Kafka without blocking (unless ``block_when_full``) or
    raising into the caller.

    Args:
        kafka_config: librdkafka settings (``Settings.kafka_client_config()``).
        linger_ms: librdkafka batching delay.
        wake_ms: how often the worker wakes when idle (``flush`` wakes it at once).
        max_queue: records the in-memory queue holds; beyond that new records are dropped
            and counted (``dropped["queue full"]``), unless ``block_when_full``.
        block_when_full: for bulk tools (simulator, trace importer, benches), never for a
            training process: ``publish`` waits for room in the queue instead of dropping,
            unless the broker is stalled (then it drops and counts, and ``drain`` raises).
        relay: the node relay's socket (:mod:`producers.relay`): step records go there,
            merged per node, whenever it takes them; to Kafka directly otherwise.
        spool_dir: where to spool during a broker outage; None keeps everything in
            librdkafka's memory (bounded by ``queue.buffering.max.kbytes``).
        spool_bytes: the spool's bound on disk; records beyond it are dropped and counted.
        stall_s: no delivery progress for this long with records in flight = outage.
        background: in a training process: the worker thread runs at a lower OS priority
            (:func:`~producers._priority.yield_cpu_to_training`); bulk tools keep theirs.

    Counters: ``delivered``, ``relayed`` (step records the node relay took), ``dropped``
    (Counter by reason), ``spooled`` (records written to the spool), ``replayed`` (read
    back from it), and :meth:`stats` for all of them plus the spool's current size.
    """

    def __init__(
        self,
        kafka_config: dict[str, Any],
        *,
        linger_ms: int = 20,
        max_queue: int = 100_000,
        spool_dir: str | Path | None = None,
        spool_bytes: int = 1 << 30,
        stall_s: float = 2.0,
        replay_batch: int = 2_000,
        wake_ms: int = 100,
        block_when_full: bool = False,
        relay: str | Path | None = None,
        background: bool = False,
    ) -> None:
        from confluent_kafka import KafkaException, Producer

        if max_queue < 1 or stall_s <= 0 or replay_batch < 1:
            raise ValueError("max_queue, stall_s and replay_batch must be positive")
        conf = dict(kafka_config)
        conf.update(
            {
                "enable.idempotence": True,
                "compression.type": "lz4",
                "linger.ms": linger_ms,
                "message.timeout.ms": 0,  # infinite: librdkafka retries in order, we watch for stalls
                "queue.buffering.max.kbytes": 262_144,
                "error_cb": self._on_error,
            }
        )
        conf.setdefault("log_level", 2)  # connection errors during an outage: our own one-line logs
        try:
            self._producer = Producer(conf, logger=logging.getLogger("argus.publisher.kafka"))
            self._kafka_exception = KafkaException
        except KafkaException as exc:
            raise KafkaSettingsError(f"invalid Kafka settings: {exc.args[0]}") from None
        self.linger_s = linger_ms / 1000
        self.wake_s = max(wake_ms, linger_ms) / 1000
        self.max_queue = max_queue
        self.block_when_full = block_when_full
        self.background = background
        self._relay = RelayClient(relay) if relay else None
        self.stall_s = stall_s
        self.replay_batch = replay_batch
        self.spool = Spool(spool_dir, max_bytes=spool_bytes) if spool_dir is not None else None
        self.delivered = 0
        self.relayed = 0
        self.dropped: Counter[str] = Counter()
        self.spooled = 0
        self.replayed = 0
        self._queue: deque[_Item] = deque()
        self._inflight: OrderedDict[int, SpoolRecord] = OrderedDict()
        self._from_spool: set[int] = set()
        self._seq = 0
        self._in_hand = 0
        self._progress = time.monotonic()
        self._brokers_down = False
        self._unknown_since: dict[str, float] = {}  # per topic: unknown to the broker since then
        self._retry: list[SpoolRecord] = []  # delivery failed on an unknown partition: again
        self._closed = False
        self._deadline: float | None = None
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="argus-publisher", daemon=True)
        self._thread.start()

    # -- the caller's side ----------------------------------------------------------------
    def publish(self, topic: str, key: bytes, record: Record | bytes) -> None:
        """Queue one record (encoded by the worker; an invalid one is counted, not raised),
        or a message already encoded."""
        self._put((topic, key, record))

    def publish_raw(self, topic: str, key: bytes, value: bytes) -> None:
        """Queue already-encoded bytes."""
        self._put((topic, key, value))

    def _put(self, item: _Item) -> None:
        if self._closed:
            self.dropped["after shutdown"] += 1
        elif len(self._queue) < self.max_queue or (self.block_when_full and self._wait_for_room()):
            # (a waiting caller may overshoot the bound by the other callers that also waited)
            self._queue.append(item)
        else:
            self.dropped["queue full"] += 1

    def _wait_for_room(self) -> bool:
        """Wait until the queue has room; False if it never will (closed, stalled broker)."""
        if threading.current_thread() is self._thread:
            return False
        # The worker takes up to 10,000 records a round and notifies _idle after each one.
        with self._idle:
            while len(self._queue) >= self.max_queue:
                if self._closed or self._stalled() or not self._thread.is_alive():
                    return False
                self._wake.set()
                self._idle.wait(0.05)
        return not self._closed

    def pending(self) -> int:
        """Records queued, spooled or in flight (not yet delivered)."""
        spooled = len(self.spool) if self.spool is not None else 0
        return len(self._queue) + self._in_hand + len(self._inflight) + spooled

    def stats(self) -> dict[str, Any]:
        """Counters for logs and metrics."""
        return {
            "delivered": self.delivered,
            "relayed": self.relayed,
            "dropped": dict(self.dropped),
            "queued": len(self._queue),
            "in_flight": len(self._inflight),
            "spooled": self.spooled,
            "replayed": self.replayed,
            "spool_records": len(self.spool) if self.spool is not None else 0,
            "spool_bytes": self.spool.bytes if self.spool is not None else 0,
            "stalled": self._stalled(),
        }

    def wake(self) -> None:
        """Have the worker send what is queued now, without waiting for it (a producer that
        publishes in rounds calls this after each: one wake-up of the worker per round)."""
        self._wake.set()

    def flush(self, timeout: float = 30.0) -> int:
        """Wait until everything queued, spooled and in flight is delivered; return what is left."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self.pending() and time.monotonic() < deadline and self._thread.is_alive():
                self._wake.set()
                self._idle.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        return self.pending()

    def drain(self, timeout: float = 60.0) -> None:
        """Flush, then raise :class:`PublishError` if anything was dropped or is still pending.

        For bulk tools, whose output is worthless with holes in it; a training process
        reads the counters instead.
        """
        left = self.flush(timeout)
        if left or self.dropped:
            lost = f"dropped: {dict(self.dropped)}" if self.dropped else "none dropped"
            raise PublishError(f"{left} records not delivered to Kafka after {timeout:g} s, {lost}")

    def shutdown(self, timeout: float = 10.0) -> bool:
        """Stop intake, deliver within one deadline, spool the rest; True if nothing was lost."""
        if self._closed:
            return True
        self._deadline = time.monotonic() + timeout
        self._closed = True
        self._wake.set()
        self._thread.join(max(0.0, self._deadline - time.monotonic()) + 5.0)
        return not self._dropped_at_close and not self._thread.is_alive()

    close = shutdown

    # -- the worker's side ---------------------------------------------------------------
    _dropped_at_close = False
    _was_stalled = False
    _spool_failing = False

    def _on_error(self, err: Any) -> None:
        from confluent_kafka import KafkaError

        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self._brokers_down = True
        if err.fatal():
            log.error("fatal Kafka client error: %s", err)

    def _on_delivery(self, seq: int, err: Any, _msg: Any) -> None:
        rec = self._inflight.get(seq)
        if rec is None:  # already spooled at shutdown (purged) or from a closed round
            self._from_spool.discard(seq)
            return
        # Count before the record leaves the in-flight set: flush() returns once nothing is
        # pending, and its caller reads the counters.
        if err is None:
            self.delivered += 1
            self._progress = time.monotonic()
            self._brokers_down = False
            self._unknown_since.pop(rec[0], None)
        elif self._not_there_yet(rec[0], err):
            self._retry.append(rec)
        else:
            self.dropped[f"delivery: {err.name()}"] += 1
            log.warning("delivery failed for a record to %s: %s", rec[0], err)
        self._from_spool.discard(seq)
        self._inflight.pop(seq, None)

    def _not_there_yet(self, topic: str, err: Any) -> bool:
        """Whether ``err`` says a topic or partition is unknown and has been so for less than
        ``UNKNOWN_TOPIC_WAIT_S``: a broker that just (re)started, or a topic being created,
        answers so for a while; records are kept and sent again. Longer, it is a topic that
        does not exist (a bad configuration): records are dropped and counted."""
        if err.code() not in _UNKNOWN:
            return False
        now = time.monotonic()
        since = self._unknown_since.setdefault(topic, now)
        if since == now:
            log.warning("Kafka says %s; keeping records for up to %.0f s", err.str(), UNKNOWN_TOPIC_WAIT_S)
        return now - since < UNKNOWN_TOPIC_WAIT_S

    def _stalled(self) -> bool:
        """Records in flight see no delivery progress: the broker is away."""
        if not self._inflight:
            return False
        return self._brokers_down or time.monotonic() - self._progress > self.stall_s

    def _encode(self, items: list[_Item]) -> list[SpoolRecord]:
        out: list[SpoolRecord] = []
        steps = [value for _, _, value in items if isinstance(value, StepBatch)]
        checked = len(steps) > 1 and valid_steps(steps)  # else each is checked as it is encoded
        held = time.perf_counter()
        for topic, key, value in items:
            held = _yield_gil(held)
            if isinstance(value, bytes):
                out.append((topic, key, value))
                continue
            try:
                out.append((topic, key, encode(value, check=not (checked and isinstance(value, StepBatch)))))
            except (SchemaError, TypeError, ValueError) as exc:
                self.dropped[f"invalid record: {type(exc).__name__}"] += 1
                log.warning("dropping an invalid %s for %s: %s", type(value).__name__, topic, exc)
        return out

    def _produce(self, records: list[SpoolRecord], *, from_spool: bool) -> int:
        """Hand records to librdkafka in order; return how many it took."""
        held = time.perf_counter()
        for n, rec in enumerate(records):
            held = _yield_gil(held)
            if self._relay is not None and rec[0] in RELAYED_TOPICS and self._relay.send(rec[2]):
                self.relayed += 1
                continue
            seq = self._seq
            try:
                self._producer.produce(
                    rec[0], value=rec[2], key=rec[1], on_delivery=partial(self._on_delivery, seq)
                )
            except BufferError:  # librdkafka's own queue is full: take the rest later
                return n
            except self._kafka_exception as exc:
                if self._not_there_yet(rec[0], exc.args[0]):  # a broker still starting: the rest later
                    return n
                self.dropped[f"produce: {exc}"[:120]] += 1
                continue
            except Exception as exc:  # e.g. a bad configuration: count, go on
                self.dropped[f"produce: {exc}"[:120]] += 1
                continue
            if not self._inflight:
                self._progress = time.monotonic()
            self._seq += 1
            self._inflight[seq] = rec
            if from_spool:
                self._from_spool.add(seq)
        return len(records)

    def _spool(self, records: list[SpoolRecord], *, prepend: bool = False) -> None:
        if not records:
            return
        if self.spool is None:
            self.dropped["broker unreachable at shutdown"] += len(records)
            self._dropped_at_close = True
            return
        try:
            rejected = self.spool.prepend(records) if prepend else self.spool.append(records)
            reason = "spool full"
            self._spool_failing = False
        except OSError as exc:  # disk full: the spool took none of them and counts its bytes
            rejected = len(records)
            reason = "spool write failed"
            if not self._spool_failing:  # one line per failure, not one per round
                log.error("cannot write the spool in %s: %s", self.spool.dir, exc.strerror or exc)
            self._spool_failing = True
        self.spooled += len(records) - rejected
        if rejected:
            self.dropped[reason] += rejected
            self._dropped_at_close = self._dropped_at_close or self._closed

    def _step(self) -> None:
        """One round: take the queue, send or spool it, replay the spool when deliveries flow."""
        stalled = self._stalled()
        if stalled != self._was_stalled:
            self._was_stalled = stalled
            if stalled:
                log.warning(
                    "Kafka unreachable: spooling to %s",
                    self.spool.dir if self.spool is not None else "memory",
                )
            else:
                log.warning(
                    "Kafka reachable again: replaying %d spooled records",
                    len(self.spool) if self.spool is not None else 0,
                )
        # Records taken off the queue count as pending until they are in flight or spooled
        # (counted before they leave the queue: flush() may over-count, never under-count).
        self._in_hand = min(len(self._queue), 10_000)
        items = [self._queue.popleft() for _ in range(self._in_hand)]
        records = self._encode(items)
        if self._retry:  # failed on an unknown partition: first, as they were first
            records, self._retry = self._retry + records, []
        spool = self.spool
        if spool is not None and (len(spool) > 0 or self._stalled()):
            self._spool(records)
        elif records:
            taken = self._produce(records, from_spool=False)
            if taken < len(records):
                if spool is not None:
                    self._spool(records[taken:])
                else:  # no spool: wait for librdkafka's queue to drain, in order
                    while taken < len(records):
                        if self._closed or self._stalled():  # nowhere to keep the rest
                            self.dropped["broker unreachable, no spool"] += len(records) - taken
                            break
                        self._producer.poll(0.05)
                        taken += self._produce(records[taken:], from_spool=False)
        self._in_hand = 0
        if spool is not None and len(spool) > 0 and not self._stalled():
            room = self.replay_batch - len(self._from_spool)
            if room > 0:
                self._in_hand = min(room, len(spool))  # handed out by read(), not in flight yet
                batch = spool.read(room)
                self.replayed += len(batch)
                taken = self._produce(batch, from_spool=True)
                if taken < len(batch):  # rare: librdkafka full; keep order by re-prepending the rest
                    self._spool(batch[taken:], prepend=True)
                self._in_hand = 0
        self._producer.poll(0)
        if spool is not None and not self._from_spool:
            spool.commit()  # every record read back so far was delivered

    def _run(self) -> None:
        if self.background:
            yield_cpu_to_training()
        while True:
            try:
                self._step()
                if self._closed:
                    self._finish()
                    return
                with self._idle:
                    self._idle.notify_all()
                if not self._queue:
                    self._wake.wait(self.wake_s)
                    self._wake.clear()
                self._producer.poll(0)
            except Exception:  # the worker must survive anything
                log.exception("publisher worker error (continuing)")
                time.sleep(self.linger_s)

    def _finish(self) -> None:
        """Deliver what we can before the deadline, then spool the rest, oldest first."""
        deadline = self._deadline or time.monotonic()
        while time.monotonic() < deadline and (
            self._queue or self._inflight or (self.spool and len(self.spool))
        ):
            self._step()
            self._producer.poll(0.02)
            if self._stalled():
                break
        if self.spool is not None and not self._from_spool:
            self.spool.commit()  # the last replayed segments were delivered: not again next time
        rest = self._encode(list(self._queue))
        self._queue.clear()
        online = [rec for seq, rec in self._inflight.items() if seq not in self._from_spool]
        self._inflight.clear()
        self._from_spool.clear()
        # records replayed from the spool stay in their (uncommitted) segments and replay again
        if self.spool is not None:
            self._spool(online, prepend=True)
            self._spool(rest)
        else:
            lost = len(online) + len(rest)
            if lost:
                self.dropped["shutdown deadline"] += lost
                self._dropped_at_close = True
        if self._relay is not None:
            self._relay.close()
        try:
            self._producer.purge(in_queue=True, in_flight=False)
            self._producer.poll(0)
        except Exception:
            pass
        with self._idle:
            self._idle.notify_all()
