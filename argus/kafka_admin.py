"""Kafka administration at the edge: reachability, topic creation, consumer groups' offsets,
and reading a topic's records back (:func:`read_records`, for benches and tests)."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._errors import ArgusError

__all__ = [
    "GroupLag",
    "KafkaUnavailable",
    "commit_offsets",
    "end_offsets",
    "ensure_topics",
    "probe_kafka",
    "read_records",
    "skip_to_end",
    "topic_partitions",
]

log = logging.getLogger("argus.kafka")


class KafkaUnavailable(ArgusError):
    """The broker cannot be reached or refused us."""


def _admin(conf: dict[str, Any], errors: list[Any] | None = None) -> Any:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    quiet = dict(conf)
    # librdkafka: critical only. Its per-attempt "Connect ... failed: Connection refused"
    # lines are errors (level 3), dozens per probe; error_cb and our message say it once.
    quiet.setdefault("log_level", 2)
    if errors is not None:
        quiet["error_cb"] = errors.append
    try:
        return AdminClient(quiet, logger=logging.getLogger("argus.kafka.admin"))
    except KafkaException as exc:  # e.g. OAUTHBEARER: no valid token within librdkafka's wait
        raise KafkaUnavailable(_reason(conf, exc.args[0] if exc.args else exc, [])) from None


def _reason(conf: dict[str, Any], err: Any, errors: list[Any]) -> str:
    """The clearest reason: an authentication failure beats the metadata timeout it causes."""
    from confluent_kafka import KafkaError

    where = conf.get("bootstrap.servers")
    if conf.get("sasl.mechanism") == "OAUTHBEARER" and any(
        getattr(e, "code", lambda: None)()
        in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED)
        for e in [*errors, err]
    ):
        first = next(e for e in [*errors, err] if hasattr(e, "code"))
        return f"Kafka at {where} refused the OAuth token (OAUTHBEARER): {_error_text(first)}"
    for e in errors:
        if e.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            user = conf.get("sasl.username", "")
            return (
                f"Kafka at {where} refused the credentials of user {user!r} ({conf.get('sasl.mechanism')}): "
                f"authentication failed"
            )
        if e.code() == KafkaError._SSL:
            return f"TLS handshake with Kafka at {where} failed: {e.str()}"
    return f"cannot reach Kafka at {where}: {_error_text(err)}"


def _error_text(err: Any) -> str:
    """A KafkaError's own words ("Local: Broker transport failure"), not its repr."""
    text = err.str() if hasattr(err, "str") else str(err)
    return str(text).splitlines()[0] if text else type(err).__name__


def probe_kafka(conf: dict[str, Any], timeout: float = 5.0) -> str:
    """One line about the cluster, or :class:`KafkaUnavailable` with the reason."""
    from confluent_kafka import KafkaException

    errors: list[Any] = []
    admin = _admin(conf, errors)
    try:
        md = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        admin.poll(0.5)  # serve the error callbacks: they say why (e.g. authentication)
        raise KafkaUnavailable(_reason(conf, err, errors)) from None
    brokers = ", ".join(f"{b.host}:{b.port}" for b in md.brokers.values())
    return f"{len(md.brokers)} broker(s) ({brokers}), {len(md.topics)} topics"


def ensure_topics(
    conf: dict[str, Any],
    topics: Iterable[str],
    *,
    partitions: int,
    timeout: float = 30.0,
    config: dict[str, str] | None = None,
    replication_factor: int = 0,
) -> list[str]:
    """Create the topics that do not exist yet (with topic ``config``, ``replication_factor``
    replicas, 0: the brokers' default); return the ones created."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    admin = _admin(conf)
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise KafkaUnavailable(
            f"cannot reach Kafka at {conf.get('bootstrap.servers')}: {_error_text(exc.args[0])}"
        ) from None
    wanted = [t for t in topics if t not in existing]
    if not wanted:
        return []
    futures = admin.create_topics(
        [
            NewTopic(
                t, num_partitions=partitions, replication_factor=replication_factor or -1, config=config or {}
            )
            for t in wanted
        ],
        operation_timeout=timeout,
    )
    created = []
    for topic, fut in futures.items():
        try:
            fut.result(timeout=timeout)
            created.append(topic)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaUnavailable(f"cannot create topic {topic}: {exc.args[0]}") from None
    _await_leaders(admin, wanted, timeout)
    return created


def _await_leaders(admin: Any, topics: list[str], timeout: float) -> None:
    """Wait until every partition of ``topics`` has a leader: a topic answers "not leader"
    for a moment after its creation, and callers read offsets or produce right away."""
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=timeout)
        pending = [
            t
            for t in topics
            if t not in md.topics
            or md.topics[t].error is not None
            or any(p.leader < 0 for p in md.topics[t].partitions.values())
        ]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise KafkaUnavailable(
                f"topics {', '.join(pending)} have no partition leader after {timeout:.0f} s"
            )
        time.sleep(0.1)


def topic_partitions(conf: dict[str, Any], topic: str, timeout: float = 10.0) -> int:
    """How many partitions ``topic`` has (0 when it does not exist)."""
    from confluent_kafka import KafkaException

    try:
        md = _admin(conf).list_topics(topic=topic, timeout=timeout)
    except KafkaException as exc:
        raise KafkaUnavailable(
            f"cannot reach Kafka at {conf.get('bootstrap.servers')}: {_error_text(exc.args[0])}"
        ) from None
    meta = md.topics.get(topic)
    return 0 if meta is None or meta.error is not None else len(meta.partitions)


def end_offsets(
    conf: dict[str, Any], topics: Iterable[str], *, wait_s: float = 30.0
) -> dict[tuple[str, int], int]:
    """The high watermark of every partition of ``topics`` (missing topics skipped), waiting
    up to ``wait_s`` for the leaders of just-created topics."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({**conf, "group.id": "argus-offsets", "enable.auto.commit": False, "log_level": 2})
    deadline = time.monotonic() + wait_s
    try:
        md = consumer.list_topics(timeout=10)
        out: dict[tuple[str, int], int] = {}
        for topic in topics:
            meta = md.topics.get(topic)
            if meta is None or meta.error is not None:
                continue
            for p in meta.partitions:
                while True:
                    try:
                        out[(topic, p)] = int(
                            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                        )
                        break
                    except KafkaException as exc:
                        if time.monotonic() > deadline:
                            raise KafkaUnavailable(
                                f"cannot read the offsets of {topic}[{p}]: {exc.args[0]}"
                            ) from None
                        time.sleep(0.2)
                        # a topic created a moment ago: the client's cached metadata may not
                        # have its partitions yet, and nothing else refreshes it for minutes
                        with contextlib.suppress(KafkaException):
                            consumer.list_topics(topic, timeout=5)
        return out
    finally:
        consumer.close()


def commit_offsets(
    conf: dict[str, Any], group: str, offsets: dict[tuple[str, int], int], *, wait_s: float = 30.0
) -> None:
    """Commit ``offsets`` for consumer group ``group`` (the group must be idle), retrying for
    up to ``wait_s`` while the broker says it cannot yet (a broker just started has no group
    coordinator for a moment: NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    if not offsets:
        return
    not_ready = {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
    }
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False, "log_level": 2})
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                consumer.commit(
                    offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False
                )
                return
            except KafkaException as exc:
                err = exc.args[0]
                later = err.code() in not_ready or err.retriable()
                if not later or time.monotonic() > deadline:
                    raise KafkaUnavailable(f"cannot position consumer group {group!r}: {err}") from None
                time.sleep(0.2)
    finally:
        consumer.close()


def skip_to_end(conf: dict[str, Any], group: str, topics: Iterable[str]) -> int:
    """Commit ``group``'s offsets at the current end of ``topics`` (a new consumer group then
    starts with what comes next, not the topics' history); returns partitions committed."""
    ends = end_offsets(conf, topics)
    commit_offsets(conf, group, ends)
    return len(ends)


def skip_worker_to_end(conf: dict[str, Any], app_id: str) -> int:
    """Place every consumer group a stream worker of ``app_id`` reads with (Faust's and its
    batch intakes', :func:`argus.streams.app.consumer_groups`) at the current end of its own
    inputs, so that a new worker reads what comes next, not the topics' history; returns the
    partitions committed."""
    from argus.streams.app import consumer_groups

    groups = consumer_groups(app_id)
    ends = end_offsets(conf, {t for topics in groups.values() for t in topics})
    committed = 0
    for group, topics in groups.items():
        own = {tp: o for tp, o in ends.items() if tp[0] in topics}
        commit_offsets(conf, group, own)
        committed += len(own)
    return committed


def read_records(
    conf: dict[str, Any],
    source: Iterable[str] | Mapping[tuple[str, int], int],
    take: Callable[[str, Any], None],
    *,
    until: Callable[[], bool],
    timeout: float,
) -> None:
    """Pass every record of ``source`` to ``take`` (with its topic), until ``until()`` holds or
    ``timeout`` seconds passed. ``source``: topics, read from their start by a fresh consumer
    group, or partitions and the offsets to read them from (e.g. :func:`end_offsets` taken
    before). Messages that do not decode are skipped (hostile input of another run)."""
    from confluent_kafka import Consumer, TopicPartition

    from argus.schemas import SchemaError, decode

    group = f"argus-read-{uuid.uuid4().hex}"
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest", "log_level": 3})
    if isinstance(source, Mapping):
        consumer.assign([TopicPartition(t, p, o) for (t, p), o in source.items()])
    else:
        consumer.subscribe(list(source))
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not until():
            for m in consumer.consume(500, timeout=0.2):
                if m.error():
                    continue
                try:
                    record = decode(m.value() or b"")
                except SchemaError:
                    continue
                take(m.topic() or "", record)
    finally:
        consumer.close()


class GroupLag:
    """Consumer lag of a consumer group (messages not yet committed), for /metrics."""

    def __init__(self, conf: dict[str, Any], group: str, topics: Iterable[str]) -> None:
        from confluent_kafka import Consumer

        self._consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False, "log_level": 2})
        self._topics = list(topics)

    def __call__(self, timeout: float = 5.0) -> dict[str, int]:
        """Lag per topic (high watermark minus committed offset, summed over partitions)."""
        from confluent_kafka import TopicPartition

        md = self._consumer.list_topics(timeout=timeout)
        parts = [
            TopicPartition(t, p) for t in self._topics if t in md.topics for p in md.topics[t].partitions
        ]
        lag: dict[str, int] = dict.fromkeys(self._topics, 0)
        for tp in self._consumer.committed(parts, timeout=timeout):
            low, high = self._consumer.get_watermark_offsets(tp, timeout=timeout)
            done = tp.offset if tp.offset >= 0 else low
            lag[tp.topic] += max(0, high - done)
        return lag

    def close(self) -> None:
        """Release the client."""
        self._consumer.close()
