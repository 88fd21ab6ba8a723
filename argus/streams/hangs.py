"""The hang stage's bookkeeping (pure): every job's latest heartbeats and which hang
anomalies are due to be sent.

The state is in memory on purpose: it is the last few seconds of heartbeats, rebuilt
within one heartbeat period after a restart (only the stall clock restarts, so a hang
that began before the restart is named at most one threshold late). A job's state expires
after ``job_ttl_s`` without heartbeats. The decisions are the detectors'
(:func:`detectors.hang.observe_heartbeats`, :func:`detectors.detect_hang`,
:func:`detectors.hang_anomalies`); this class only keeps their state and the send schedule:
each anomaly id when first named, then again every ``update_s`` with the cost so far.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from argus.detectors import HangConfig, HangState, detect_hang, hang_anomalies, observe_heartbeats
from argus.detectors.hang import ClockOffsets
from argus.schemas import Anomaly, Heartbeat, HeartbeatBatch

__all__ = ["HangTracker"]

log = logging.getLogger("argus.streams")


class HangTracker:
    """The latest heartbeat of every rank of every job (a :class:`detectors.HangState` per
    job run) and when each hang anomaly was last sent.

    Bounded: ``max_jobs`` jobs, ranks by ``rank_slack`` and groups by ``max_groups`` (the
    heartbeats that claim more are refused), heartbeat stacks (each rank's is a sender's
    text) to ``max_job_stack_bytes`` characters a job and ``max_stack_bytes`` in all (cut to
    their innermost frames beyond), learned clock offsets to ``max_hosts`` hosts."""

    def __init__(
        self,
        config: HangConfig | None = None,
        *,
        rank_slack: int = 1024,
        max_groups: int = 64,
        max_jobs: int = 16_384,
        job_ttl_s: float = 6 * 3600.0,
        update_s: float = 60.0,
        max_hosts: int = 65_536,
        max_job_stack_bytes: int = 8 * 2**20,
        max_stack_bytes: int = 64 * 2**20,
    ) -> None:
        self.config = config or HangConfig()
        self.rank_slack = rank_slack
        self.max_groups = max_groups
        self.max_jobs = max_jobs
        self.job_ttl_s = job_ttl_s
        self.update_s = update_s
        self.states: dict[tuple[str, int], HangState] = {}
        self.sent: dict[str, float] = {}  # anomaly id -> when last sent (monotonic)
        self.clocks = ClockOffsets(max_hosts=max_hosts)
        self.max_job_stack_bytes = max_job_stack_bytes
        self.max_stack_bytes = max_stack_bytes
        self._cut_to = 0  # the share every job's stacks were last cut to

    @property
    def jobs(self) -> int:
        return len(self.states)

    def observe(
        self, records: Sequence[tuple[Heartbeat | HeartbeatBatch, Any]], arrival_ns: int | None = None
    ) -> tuple[int, list[tuple[Any, str, str]]]:
        """Feed a consumer batch of heartbeats (each with its token): the heartbeats taken,
        and the refused records' tokens with a reason and an error. ``arrival_ns``: when the
        batch came, on the clock :meth:`due` is given; the heartbeats' times are put on it by
        their host's learned offset (:class:`~detectors.ClockOffsets`). None: the senders'
        clocks are taken as they are (a replay of recorded heartbeats)."""
        taken, refused = observe_heartbeats(
            self.states,
            records,
            rank_slack=self.rank_slack,
            max_groups=self.max_groups,
            progress_points=self.config.progress_points,
            max_jobs=self.max_jobs,
            clocks=self.clocks if arrival_ns is not None else None,
            arrival_ns=arrival_ns or 0,
            max_stack_bytes=self.max_job_stack_bytes,
        )
        self.bound_stacks()
        return taken, refused

    @property
    def stack_bytes(self) -> int:
        """The characters of every kept stack, all jobs together."""
        return sum(state.stack_bytes for state in self.states.values())

    def bound_stacks(self) -> None:
        """Keep all jobs' stacks to ``max_stack_bytes`` together: beyond, every job above an
        equal share has its stacks cut to that share (their innermost frames stay)."""
        if self.stack_bytes <= self.max_stack_bytes:
            return
        share = self.max_stack_bytes // max(1, len(self.states))
        for state in self.states.values():
            if state.stack_bytes > share:
                state.shrink_stacks(share)
        if share != self._cut_to:  # once per share, not every batch
            self._cut_to = share
            log.warning(
                "hang stage: heartbeat stacks of %d jobs over %d bytes; cut to %d bytes a job",
                len(self.states),
                self.max_stack_bytes,
                share,
            )

    def due(self, now_ns: int, now: float) -> Iterator[tuple[Anomaly, bool]]:
        """The hang anomalies to send now, each with whether it is named for the first time.

        ``now_ns``: the detector's clock (ns since the epoch, compared with the heartbeats');
        ``now``: the send schedule's (monotonic). A job silent for ``job_ttl_s`` is forgotten
        on the way. Lazy: call :meth:`mark_sent` for each before taking the next.
        """
        for key, state in list(self.states.items()):
            if state.seen.any() and now_ns - int(state.time_ns.max()) > self.job_ttl_s * 1e9:
                del self.states[key]
                continue
            try:
                anomalies = hang_anomalies(detect_hang(state, now_ns, self.config))
            except Exception:  # one job's odd heartbeats must not stop the others' detection
                log.exception("hang detection for job %.100s failed", key[0])
                continue
            for anomaly in anomalies:
                last = self.sent.get(anomaly.id)
                if last is None or now - last >= self.update_s:
                    yield anomaly, last is None

    def mark_sent(self, anomaly_id: str, now: float) -> None:
        """The anomaly went out (or cannot): not again before the next update."""
        self.sent[anomaly_id] = now

    def prune(self, now: float) -> None:
        """Forget the ids not sent for ``job_ttl_s``."""
        for aid in [a for a, t in self.sent.items() if now - t > self.job_ttl_s]:
            del self.sent[aid]
