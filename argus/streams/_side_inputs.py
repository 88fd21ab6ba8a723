"""The worker's inputs read in librdkafka batches, outside Faust (:mod:`streams.intake`):
heartbeats into the hang tracker, and kernel sketches and stacks re-keyed by job for the
kernel level (:mod:`streams.deepening`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from argus.schemas import (
    DecodeError,
    Heartbeat,
    HeartbeatBatch,
    SchemaError,
    decode_many,
)

from ._sending import Sending
from .deepening import EVIDENCE_TOPIC, EvidenceHistory, rekey
from .hangs import HangTracker
from .intake import BatchIntake, RawInput

__all__ = ["SideInputs"]

log = logging.getLogger("argus.streams")


def _cut_line(text: str, limit: int = 400) -> str:
    """Sender-given text for one log line: at most ``limit`` characters (a hang's summary
    quotes a stack frame as long as the rank sent it), control characters escaped."""
    cut = text if len(text) <= limit else text[: limit - 1] + "…"
    return cut.encode("unicode_escape").decode("ascii", errors="replace") if not cut.isprintable() else cut


class SideInputs(Sending):
    """The hang and kernel-level tasks and timer (methods of :class:`Streams`)."""

    hangs: HangTracker
    heartbeat_intake: BatchIntake
    evidence_intake: BatchIntake
    history: EvidenceHistory
    skipped: set[Any]

    # -- hangs ---------------------------------------------------------------------------------

    async def watch_heartbeats(self) -> None:
        """Task: the heartbeats topic, a consumer batch at a time (:mod:`streams.intake`)."""
        await self.keep_reading(self.heartbeat_intake, self.take_heartbeats)

    async def take_heartbeats(self, inputs: Sequence[RawInput]) -> None:
        """One batch of the heartbeats topic into the hang tracker; what is not a heartbeat,
        or is refused by the tracker, to the dead letters."""
        records = []
        for raw, record in zip(inputs, decode_many([raw.value for raw in inputs]), strict=True):
            if isinstance(record, Heartbeat | HeartbeatBatch):
                records.append((record, raw))
            else:  # a SchemaError, or a record of another type
                bad = record if isinstance(record, SchemaError) else DecodeError(type(record).__name__)
                await self.dead_letter(raw, bad.reason, f"not a heartbeat: {bad}")
        # on this worker's clock, which detect_hangs compares them with (skewed senders' corrected)
        taken, refused = self.hangs.observe(records, arrival_ns=time.time_ns())
        for raw, reason, error in refused:
            await self.dead_letter(raw, reason, error)
        self.metrics.heartbeats += taken
        self.metrics.messages_by_input["heartbeats"] += len(inputs)
        self.metrics.hang_jobs = self.hangs.jobs

    async def detect_hangs(self) -> None:
        """Timer (``hang_tick_s``, the detector's clock): send the hang anomalies due."""
        now_ns, now = time.time_ns(), time.monotonic()
        for anomaly, first in self.hangs.due(now_ns, now):
            fut = await self.send_anomaly(anomaly)
            if fut is not None:
                await fut
                if first:
                    self.metrics.anomalies[anomaly.cause] += 1
                    log.warning("hang: %s", _cut_line(anomaly.summary))
            self.hangs.mark_sent(anomaly.id, now)  # not again before the next update
        self.hangs.prune(now)

    # -- kernel level (streams/deepening.py) ------------------------------------------------
    # Kernel sketches and stacks, keyed by rank (two per rank per step: read in batches by a
    # BatchIntake), re-keyed by job into a topic co-partitioned with the findings, packed;
    # kept a few steps per rank. Best effort (acks=False): a partition first seen with
    # messages older than history.max_age_s (a new group on the topics' backlog) is moved
    # to its end, once.

    async def watch_evidence(self) -> None:
        """Task: the kernel sketches and stacks, a consumer batch at a time."""
        await self.keep_reading(self.evidence_intake, self.rekey_evidence)

    async def rekey_evidence(self, inputs: Sequence[RawInput]) -> None:
        """One batch of kernel sketches and stacks onto the evidence topic, keyed by job;
        what has neither a rank key nor decodes, to the dead letters."""
        out, bad = rekey([(raw.key, raw.value) for raw in inputs], self.cfg.max_message_bytes)
        self.metrics.messages_by_input["evidence"] += len(inputs)
        for i, exc in bad:
            await self.dead_letter(inputs[i], exc.reason, str(exc))
        for key, blob in out:  # queued, not awaited: the history is best effort
            await self.app.producer.send(EVIDENCE_TOPIC, key, blob, None, None, None)

    async def keep_evidence(self, stream: Any) -> None:
        async for events in stream.take_events(self.cfg.take, within=self.cfg.within_s):
            self.history.add_packed([e.value for e in await self.recent_only(events)])

    async def recent_only(self, events: list[Any]) -> list[Any]:
        """The events younger than ``history.max_age_s`` (see BatchIntake's ``max_age_s``)."""
        recent = time.time() - self.cfg.history.max_age_s
        stale = {e.message.tp for e in events if e.message.timestamp < recent} - self.skipped
        if stale:
            self.skipped.update(stale)
            for tp, end in (await self.app.consumer.highwaters(*stale)).items():
                await self.app.consumer.seek(tp, end)
        return [e for e in events if e.message.timestamp >= recent]
