"""The cross-rank stage (agent ``assemble``, source ``argus.steps``): a step's parts
assembled, the whole step through the cross-rank detectors, its findings sent."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import faust
from aiokafka.errors import MessageSizeTooLargeError

from argus.schemas import (
    SchemaError,
    StepBatch,
    ValidationError,
    decode_many,
    job_key,
)

from ._sending import Sending
from .assembly import CompleteStep, StepAssembler
from .outputs import step_outputs

__all__ = ["CrossRankStage"]

log = logging.getLogger("argus.streams")


def _forget_unacked(app: faust.App, events: Sequence[Any]) -> None:
    """Let Faust's consumer stop waiting for events that will never be acknowledged.

    At a rebalance or a stop, Faust waits until every message it delivered is acknowledged
    (``stream_wait_empty``) before it commits and gives the partitions up. The parts of a
    step dropped then (:meth:`StepAssembler.drop_open`) never will be: their offsets stay
    uncommitted, so the partition's next owner reads them again, whole. Faust offers no call
    for that, so they leave its set of unacknowledged messages here.
    """
    unacked = getattr(app.consumer, "_unacked_messages", None)
    if unacked is None:
        return
    for event in events:
        unacked.discard(event.message)


class CrossRankStage(Sending):
    """The cross-rank stage's agent and task (methods of :class:`Streams`)."""

    assembler: StepAssembler
    reading: bool
    origin: list[tuple[str, bytes]]

    async def assemble(self, stream: Any) -> None:
        async for events in stream.take_events(self.cfg.take, within=self.cfg.within_s):
            self.reading = True
            now = time.monotonic()
            # One decode for the whole batch of events: its StepBatches are checked in one pass.
            parts = decode_many([event.value or b"" for event in events], expect=StepBatch)
            for event, part in zip(events, parts, strict=True):
                await self.add_part(event, part, now)
            for done in self.assembler.due(now) if not self.leaving else ():
                await self.finish(done)
            self.reading = False
            self.metrics.open_steps = self.assembler.open_steps

    async def keep_completing(self) -> None:
        """:meth:`complete_waiting` every 0.25 s, through the app's stop too: Faust's timers
        end when the stop begins, but the stop then waits for every message delivered to be
        acknowledged, and the parts of open steps never would be, until they are dropped."""
        while True:
            await asyncio.sleep(0.25)
            await self.complete_waiting()

    async def complete_waiting(self) -> None:
        """Every 0.25 s (:meth:`keep_completing`): complete the steps that waited long enough; at a rebalance or a
        stop, drop the open ones unacknowledged (the partitions' next owner reads them)."""
        if self.reading:
            return  # mid-batch, a step's next parts may be further on in it; the agent checks at its end
        if self.leaving:
            dropped = self.assembler.drop_open()
            if dropped:
                _forget_unacked(self.app, dropped)
                log.info("rebalance: %d parts of open steps dropped, unacknowledged", len(dropped))
            self.metrics.open_steps = 0
            return
        for done in self.assembler.due(time.monotonic()):
            await self.finish(done)
        self.metrics.open_steps = self.assembler.open_steps

    @property
    def leaving(self) -> bool:
        """The partitions go elsewhere (or back): read again there."""
        return bool(self.app.rebalancing or self.app.should_stop)

    async def add_part(self, event: Any, part: StepBatch | SchemaError, now: float) -> None:
        self.metrics.messages += 1
        if isinstance(part, SchemaError):
            await self.dead_letter(event, part.reason, str(part))
            return
        # take_events acknowledges the whole batch once we are done with it (noack() does
        # not change that); a part of a step still open must stay unacknowledged, so hold a
        # reference of our own, released in finish().
        event.message.incref()
        self.metrics.records += len(part)
        for done in self.assembler.add(part, event, now):
            await self.finish(done)

    async def finish(self, done: CompleteStep) -> None:
        """Send a complete step's outputs, then acknowledge its parts (or dead-letter them)."""
        self.metrics.steps[done.reason] += 1
        if done.rejected:
            await self.reject(
                done.rejected, "absurd_rank", "the part claims only ranks beyond the job's world"
            )
        if done.reason == "far_future":
            frontier = "its last completed step"
            await self.reject(done.tokens, "far_future", f"step {done.batch.step} is far ahead of {frontier}")
            return
        if done.reason not in ("late", "absurd_rank"):
            reason, error = await self.publish_step(done)
            if reason:
                await self.reject(done.tokens, reason, error)
                return
        for event in done.tokens:
            event.ack()

    async def publish_step(self, done: CompleteStep) -> tuple[str, str]:
        """Diagnose a complete step and send its findings, delivered; a reason and an error
        when they cannot be (its parts are dead-lettered then). The summary is checked here
        (with the findings it travels in) and sent by the temporal stage: a step that a
        rebalance makes the cross-rank stage read and complete twice is summarized once."""
        try:
            sf, findings = step_outputs(done, self.cfg.diagnoser, self.cfg.max_message_bytes)
        except ValidationError as exc:
            return "output_too_large", str(exc)
        except Exception as exc:  # a detector bug on odd input must not stop the worker
            log.exception("step %d of %s: diagnosis failed", done.batch.step, done.batch.job)
            return "diagnosis_failed", repr(exc)
        key = job_key(done.batch.job)
        try:
            fut = await self.topics.findings.send(key=key, value=findings, headers=self.origin)
            await fut  # delivered before the parts are acknowledged
        except MessageSizeTooLargeError as exc:
            return "output_too_large", repr(exc)
        self.metrics.completion_s.append(max(0.0, (time.time_ns() - sf.end_ns) / 1e9))
        return "", ""
