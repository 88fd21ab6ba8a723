"""What a stream worker is configured with (built from ARGUS_* settings by the composition
root) and the Faust app it makes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust

from argus.detectors import DiagnoserConfig, HangConfig

from .assembly import AssemblyConfig
from .deepening import HistoryConfig
from .outputs import MAX_MESSAGE_BYTES

__all__ = ["StreamConfig", "faust_app"]


@dataclass(frozen=True)
class StreamConfig:
    """Everything a worker needs; built from ARGUS_* settings by the composition root."""

    broker: str = "kafka://127.0.0.1:9092"
    credentials: Any = None
    kafka_config: Mapping[str, Any] = field(default_factory=lambda: {"bootstrap.servers": "127.0.0.1:9092"})
    """librdkafka settings for the same brokers (the heartbeat intake's consumer)."""
    app_id: str = "argus-streams"
    partitions: int = 16
    store: str = "memory://"
    datadir: str = ".argus/streams"
    take: int = 512
    within_s: float = 0.05
    assembly: AssemblyConfig = field(default_factory=AssemblyConfig)
    diagnoser: DiagnoserConfig = field(default_factory=DiagnoserConfig)
    job_ttl_s: float = 6 * 3600.0
    max_held_steps: int = 1024
    """Steps of a job held (waiting for an earlier one) at most before the gap is given up."""
    max_held_bytes: int = 16 * 2**20
    """Bytes of a job's held steps' findings at most before the gap is given up."""
    reorder_wait_s: float = 30.0
    start_wait_s: float = 5.0
    session_timeout_s: float = 15.0
    """A worker that stops heartbeating (killed) loses its partitions after this long."""
    replication_factor: int = 0
    """Replicas of the topics the worker creates (:meth:`Streams.own_topics`); 0: the
    brokers' default. One replica loses the job states with one broker."""
    hang: HangConfig = field(default_factory=HangConfig)
    hang_tick_s: float = 1.0
    hang_update_s: float = 60.0
    idle_refresh_s: float = 5.0
    """A job without a new step for this long has its open anomalies sent as they stand."""
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_groups: int = 64
    """Process groups per heartbeat at most (the hang state is ranks × groups wide)."""
    max_hang_jobs: int = 16_384
    """Jobs whose heartbeats are kept at once (the least recently seen is dropped beyond)."""
    max_hang_job_stack_bytes: int = 8 * 2**20
    """Heartbeat stacks kept per job, characters (each rank's cut to its innermost frames beyond)."""
    max_hang_stack_bytes: int = 64 * 2**20
    """Heartbeat stacks kept over all jobs, characters."""
    history: HistoryConfig = field(default_factory=HistoryConfig)
    """The kernel sketches and stack samples kept per rank for the kernel level."""


def faust_app(cfg: StreamConfig) -> faust.App:
    """The Faust app (raw bytes in and out: the agents decode with schemas/)."""
    Path(cfg.datadir).mkdir(parents=True, exist_ok=True)
    return faust.App(
        cfg.app_id,
        broker=cfg.broker,
        broker_credentials=cfg.credentials,
        store=cfg.store,
        datadir=cfg.datadir,
        topic_partitions=cfg.partitions,
        # The app's own topics are created before it starts (own_topics), with the brokers'
        # default unless a factor is set; Faust's value counts only for a topic it must create.
        topic_replication_factor=cfg.replication_factor or 3,
        topic_disable_leader=True,  # no leader-only timers: no leader topic to create
        key_serializer="raw",
        value_serializer="raw",
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        broker_commit_every=1000,
        broker_commit_interval=0.5,
        producer_linger=0.005,
        stream_buffer_maxsize=16384,
        consumer_max_fetch_size=4 * 2**20,
        broker_session_timeout=cfg.session_timeout_s,
        broker_heartbeat_interval=min(3.0, cfg.session_timeout_s / 3),
    )
