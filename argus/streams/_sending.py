"""What every stage of the worker shares: its outputs (dead letters, anomalies, each
delivered or logged and counted, never raised out of an agent) and the loop of a batch
intake. :class:`~argus.streams.app.Streams` is built from the stages over this base."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import faust
from aiokafka.errors import MessageSizeTooLargeError

from argus.schemas import (
    Anomaly,
    DeadLetter,
    SchemaError,
    encode,
    job_key,
)

from .config import StreamConfig
from .intake import BatchIntake, RawInput
from .metrics import StreamMetrics
from .outputs import bounded_anomaly
from .topics import Topics

__all__ = ["Sending"]

log = logging.getLogger("argus.streams")


class Sending:
    """The worker's outputs and intake loop; the attributes are set by :class:`Streams`."""

    cfg: StreamConfig
    metrics: StreamMetrics
    app: faust.App
    topics: Topics

    async def dead_letter(self, source: Any, reason: str, error: str) -> None:
        """Send one input (a Faust event or a :class:`RawInput`) to the dead-letter topic
        (bounded) and wait until it is delivered."""
        raw = source if isinstance(source, RawInput) else RawInput.of_event(source)
        self.metrics.dead_letters[reason] += 1
        log.warning(
            "dead letter %s[%d]@%d: %s: %s", raw.topic, raw.partition, raw.offset, reason, error[:300]
        )
        payload = raw.value
        record = DeadLetter.of(raw.topic, raw.partition, raw.offset, reason, error, time.time_ns(), payload)
        fut = await self.topics.dead.send(
            key=raw.key[:1024],
            value=encode(record),
            headers=[
                ("argus-reason", record.reason.encode()),
                ("argus-error", error[:500].encode(errors="replace")),
                ("argus-size", str(len(payload)).encode()),
            ],
        )
        await fut

    async def reject(self, events: Any, reason: str, error: str) -> None:
        for event in events:
            await self.dead_letter(event, reason, error)
            event.ack()

    async def send_anomaly(self, anomaly: Anomaly) -> Any:
        """Send one anomaly (bounded); None when it cannot be encoded or sent (logged, counted)."""
        try:
            value = encode(bounded_anomaly(anomaly))
            return await self.topics.anomalies.send(key=job_key(anomaly.job)[:1024], value=value)
        except (SchemaError, MessageSizeTooLargeError, TypeError, ValueError) as exc:
            self.metrics.dead_letters["invalid_output"] += 1
            log.error("anomaly %s of job %.100s not sent: %s", anomaly.id, anomaly.job, str(exc)[:300])
            return None

    @staticmethod
    async def delivered(fut: Any, what: str) -> bool:
        """Wait for a send's delivery; False (logged) when the broker did not take it."""
        try:
            await fut
        except Exception as exc:  # KafkaError, or Faust's wrapping of one
            log.error("%s not delivered: %r", what, exc)
            return False
        return True

    async def keep_reading(self, intake: BatchIntake, handle: Any) -> None:
        """Run a batch intake for good (an error it cannot get past is logged, then retried)."""
        while True:
            try:
                await intake.run(handle)
            except Exception:  # e.g. settings librdkafka refuses: say so, try again
                log.exception("reading %s failed; again in 5 s", intake.name)
                await asyncio.sleep(5.0)
