"""The worker's topics: those it reads and writes, its Faust topics, the topics it creates
before it starts, and its consumer groups with their inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import faust
from faust.types import TopicT

from argus.schemas import (
    ANOMALIES,
    DEAD_LETTER,
    HEARTBEATS,
    KERNELS,
    STACKS,
    STEP_FINDINGS,
    STEP_SUMMARIES,
    STEPS,
)

from .deepening import EVIDENCE_TOPIC
from .intake import intake_group

__all__ = ["WORKER_TOPICS", "Topics", "consumer_groups", "own_topics"]

WORKER_TOPICS = (STEPS, STEP_FINDINGS, STEP_SUMMARIES, ANOMALIES, DEAD_LETTER, HEARTBEATS)
"""The topics a worker reads and writes, created before it starts (its tables' changelogs
and the internal evidence topic are created after, from the app)."""


@dataclass(frozen=True)
class Topics:
    """The app's topics (keys and values raw bytes)."""

    steps: TopicT
    findings: TopicT
    summaries: TopicT
    anomalies: TopicT
    dead: TopicT
    evidence: TopicT
    """Kernel sketches and stack samples re-keyed by job, co-partitioned with the findings
    (internal; best effort: ``acks=False``)."""

    @classmethod
    def declare(cls, app: faust.App, partitions: int) -> Topics:
        def topic(*names: str, **kw: Any) -> TopicT:
            return app.topic(*names, key_type=bytes, value_type=bytes, **kw)

        return cls(
            steps=topic(STEPS, partitions=partitions),
            findings=topic(STEP_FINDINGS, partitions=partitions),
            summaries=topic(STEP_SUMMARIES),
            anomalies=topic(ANOMALIES),
            dead=topic(DEAD_LETTER),
            evidence=topic(EVIDENCE_TOPIC, partitions=partitions, internal=True, acks=False),
        )


def own_topics(app: faust.App) -> list[tuple[str, dict[str, str]]]:
    """The topics of a worker's app that Faust would otherwise create itself, with a fixed
    replication factor, each with its topic config: its tables' changelogs (compacted) and
    its internal evidence topic; all co-partitioned with the findings topic. The worker
    creates them before it starts, with ``StreamConfig.replication_factor``."""
    changelogs = [
        (t.changelog_topic.get_topic_name(), {"cleanup.policy": "compact"}) for t in app.tables.values()
    ]
    return [*changelogs, (EVIDENCE_TOPIC, {})]


def consumer_groups(app_id: str) -> dict[str, tuple[str, ...]]:
    """The consumer groups a worker of ``app_id`` reads with, each with its inputs: Faust's
    (steps, findings, the internal evidence topic), then its batch intakes' (heartbeats;
    kernel sketches and stacks)."""
    return {
        app_id: (STEPS, STEP_FINDINGS, EVIDENCE_TOPIC),
        intake_group(app_id, "heartbeats"): (HEARTBEATS,),
        intake_group(app_id, "evidence"): (KERNELS, STACKS),
    }
