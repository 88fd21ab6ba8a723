"""What a stream worker counts (:class:`StreamMetrics`) and how it shows on Prometheus'
``/metrics`` (:func:`metric_families`: the descriptors ``argus worker --metrics-port``
serves)."""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .assembly import COMPLETIONS

__all__ = [
    "LATENCY_BUCKETS_S",
    "SUMMARY_OUTCOMES",
    "Family",
    "LatencyHistogram",
    "StreamMetrics",
    "metric_families",
    "summary",
]

Family = tuple[str, str, dict[tuple[tuple[str, str], ...], Any]]
"""One metric family: kind ("counter", "gauge", "histogram"), help, {label pairs: value}."""

LATENCY_BUCKETS_S = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, float("inf"))
"""Bucket bounds of ``argus_worker_step_completion_seconds`` (first part in to findings out)."""

SUMMARY_OUTCOMES = {
    "diagnosed": "diagnosed in order, summary sent",
    "late": "came after the diagnosis went past it, summary sent",
    "duplicate": "summarized already, none sent",
    "failed": "summary not sent, see the log",
    "lost": "findings not found in the held-steps table, see the log",
}
"""What became of each step's findings in the temporal stage (``argus_worker_summaries_total``'s
label), in words: every step the cross-rank stage completes ends in exactly one of these."""


class LatencyHistogram(deque[float]):
    """The worker's bounded deque of step completion latencies that also keeps a cumulative
    Prometheus histogram: every ``append`` is counted once in the buckets, whatever the
    deque drops."""

    def __init__(self, values: Iterable[float] = (), maxlen: int | None = None) -> None:
        super().__init__(maxlen=maxlen)
        self._lock = threading.Lock()
        self.counts = [0] * len(LATENCY_BUCKETS_S)
        self.total = 0.0
        for v in values:
            self.append(v)

    def append(self, value: float) -> None:
        with self._lock:
            super().append(value)
            self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, value)] += 1
            self.total += value

    def buckets(self) -> tuple[list[tuple[float, int]], float]:
        """Cumulative ``(upper bound, count)`` pairs ending with +inf, and the sum of seconds."""
        with self._lock:
            out, running = [], 0
            for le, n in zip(LATENCY_BUCKETS_S, self.counts, strict=True):
                running += n
                out.append((le, running))
            return out, self.total


@dataclass
class StreamMetrics:
    """Counters a worker exposes on /metrics (and tests read)."""

    records: int = 0
    messages: int = 0
    steps: Counter[str] = field(default_factory=Counter)
    anomalies: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    completion_s: LatencyHistogram = field(default_factory=lambda: LatencyHistogram(maxlen=4096))
    open_steps: int = 0
    heartbeats: int = 0
    hang_jobs: int = 0
    messages_by_input: Counter[str] = field(default_factory=Counter)
    """Messages the batch intakes took (heartbeats; kernel sketches and stacks)."""
    summaries: Counter[str] = field(default_factory=Counter)
    """Steps' findings by what became of their summary (a key of :data:`SUMMARY_OUTCOMES`)."""
    steps_given_up: int = 0
    """Steps the temporal stage stopped waiting for and diagnosed past (``late`` if they come)."""
    started: float = field(default_factory=time.monotonic)


def metric_families(metrics: StreamMetrics, lags: Mapping[str, int]) -> dict[str, Family]:
    """The worker's metric families for :func:`argus.metrics.serve_metrics`: name ->
    (type, help, {labels: value}); ``lags``: messages not yet processed, per topic."""
    return {
        "argus_worker_consumer_lag": (
            "gauge",
            "messages not yet processed, per topic",
            {(("topic", t),): v for t, v in lags.items()},
        ),
        "argus_worker_records_total": ("counter", "rank-step records consumed", {(): metrics.records}),
        "argus_worker_messages_total": ("counter", "Kafka messages consumed", {(): metrics.messages}),
        "argus_worker_steps_total": (
            "counter",
            "steps completed, by how",
            {(("reason", k),): v for k, v in metrics.steps.items()},
        ),
        "argus_worker_anomalies_total": (
            "counter",
            "anomaly records published, by root cause (an open anomaly is sent again as its window grows)",
            {(("cause", k),): v for k, v in metrics.anomalies.items()},
        ),
        "argus_worker_dead_letters_total": (
            "counter",
            "bad messages sent to the dead-letter topic",
            {(("reason", k),): v for k, v in metrics.dead_letters.items()},
        ),
        "argus_worker_open_steps": ("gauge", "steps waiting for ranks", {(): metrics.open_steps}),
        "argus_worker_heartbeats_total": (
            "counter",
            "rank heartbeats taken by the hang stage",
            {(): metrics.heartbeats},
        ),
        "argus_worker_hang_jobs": ("gauge", "job runs whose heartbeats are kept", {(): metrics.hang_jobs}),
        "argus_worker_intake_messages_total": (
            "counter",
            "Kafka messages the batch intakes took, by input",
            {(("input", k),): v for k, v in metrics.messages_by_input.items()},
        ),
        "argus_worker_summaries_total": (
            "counter",
            "steps' findings taken by the temporal stage, by what became of their summary",
            {(("outcome", k),): v for k, v in metrics.summaries.items()},
        ),
        "argus_worker_steps_given_up_total": (
            "counter",
            "steps the temporal stage stopped waiting for and diagnosed past",
            {(): metrics.steps_given_up},
        ),
        "argus_worker_step_completion_seconds": (
            "histogram",
            "first part of a step in to its findings out, seconds",
            {(): metrics.completion_s.buckets()},
        ),
    }


def summary(metrics: StreamMetrics) -> str:
    """One line of what a worker did, for its log when it stops."""

    def counts(c: Counter[str], words: dict[str, str] | None = None) -> str:
        if not c:
            return ""
        gloss = words or {}
        return f" ({', '.join(f'{k} {n}' + (f': {gloss[k]}' if k in gloss else '') for k, n in sorted(c.items()))})"

    return (
        f"{metrics.records} rank-step records in {metrics.messages} messages, "
        f"{sum(metrics.steps.values())} steps completed{counts(metrics.steps, COMPLETIONS)}, "
        f"{sum(metrics.summaries.values())} steps' findings{counts(metrics.summaries, SUMMARY_OUTCOMES)}, "
        f"{metrics.steps_given_up} steps given up, "
        f"{sum(metrics.anomalies.values())} anomaly records{counts(metrics.anomalies)} "
        "(versions: an open anomaly is sent again as its window grows), "
        f"{metrics.heartbeats} heartbeats, {sum(metrics.dead_letters.values())} dead letters"
        f"{counts(metrics.dead_letters)}"
    )
