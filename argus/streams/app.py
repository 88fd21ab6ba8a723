"""The Faust app of the stream workers: topics, table and agents, declared once.

Two stages (docs/architecture.md#rekey):

- **cross-rank** (agent ``assemble``, source ``argus.steps`` keyed by job/step): the parts
  of a step (one StepBatch per host or per rank) meet in one worker and are assembled
  (:mod:`streams.assembly`); the whole step goes through the stateless cross-rank
  detectors (:func:`detectors.step_findings`); the worker publishes the step's findings
  (``argus.step-findings``, keyed by job; they hold the step's summary).
  Parts are acknowledged only once their step went out, so a killed worker loses nothing:
  Kafka redelivers what was not acknowledged.
- **temporal** (agent ``diagnose``, source ``argus.step-findings`` keyed by job): the
  job's state (iteration baseline, open episodes) lives in a changelog-backed table; each
  step's findings update it (:func:`detectors.apply_findings`) and confirmed episodes go to
  ``argus.anomalies``. Steps are diagnosed in order: a step that arrives before an earlier
  one waits, its findings in a second table (one write each, so a job with many steps
  waiting does not rewrite them all on every step), until the gap fills or times out
  (:class:`Reorderer`, :mod:`streams.ordering`).
  An anomaly is sent and delivered before the state that produced it is written, and
  anomaly ids are deterministic: after a SIGKILL the restarted worker may send an anomaly
  again, never loses one, and downstream keeps each id once.

- **hangs** (task ``watch_heartbeats``, source ``argus.heartbeats`` keyed by job): the
  latest heartbeat of every rank of a job, kept by a :class:`HangTracker`
  (:mod:`streams.hangs`), fed one vectorized pass per job per consumer batch (node relays'
  HeartbeatBatches and direct per-rank Heartbeats alike). The worker's largest input, so it
  is read in librdkafka batches by a :class:`BatchIntake` (its own consumer group, the app
  id + ``-heartbeats``), not event by event through a Faust agent (:mod:`streams.intake`
  says why, with figures); a timer (``hang_tick_s``, the
  detector's clock) sends the hang / lost-rank anomalies the tracker says are due to
  ``argus.anomalies`` (each id when first named, then again every ``hang_update_s`` with
  the cost so far). This state is in memory on purpose (see :mod:`streams.hangs`).

Bad input (bytes that do not decode or validate) goes to ``argus.dead-letter`` with the
reason in the headers and a counter; the worker never crashes on input. Input that is valid
but hostile is bounded or dead-lettered too: a part claiming only ranks beyond any
plausible world (``absurd_rank``), a step far ahead of its job's frontier (``far_future``,
in the cross-rank stage and again in the temporal one, whose frontier survives restarts),
a step whose summary or findings would not fit in one message (``output_too_large``) or
whose diagnosis fails (``diagnosis_failed``). Every output record is bounded before it is
encoded (:func:`bounded_anomaly`; the step summary's missing list by the assembler), and an
output that still fails to encode is logged and counted per record, never raised out of an
agent or timer. Dead letters are built by :meth:`DeadLetter.of` (bounded: a prefix of an
oversized input and its size) and delivered before their input is acknowledged.

Shape (Faust's: app, topics, tables, then agents of a few lines calling pure classes): the
app, its topics and tables are declared once per :class:`Streams`, whose methods are the
agents and timers. It is a class and not module globals because the app is configured at
run time (``argus worker --app-id``, settings read by the composition root in ``argus/``,
which ``streams/`` may not import) and because tests build several apps with different
configurations in one process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from aiokafka.errors import MessageSizeTooLargeError
from faust.exceptions import ProducerSendError
from faust.types import TopicT

from argus.detectors import DiagnoserConfig, HangConfig, JobState, apply_findings, check_shape, refresh
from argus.schemas import (
    ANOMALIES,
    DEAD_LETTER,
    HEARTBEATS,
    KERNELS,
    STACKS,
    STEP_FINDINGS,
    STEP_SUMMARIES,
    STEPS,
    Anomaly,
    DeadLetter,
    DecodeError,
    Heartbeat,
    HeartbeatBatch,
    JobOrder,
    SchemaError,
    StepBatch,
    StepFindings,
    ValidationError,
    decode,
    decode_many,
    encode,
    job_key,
)

from .assembly import AssemblyConfig, CompleteStep, StepAssembler
from .deepening import EVIDENCE_TOPIC, EvidenceHistory, HistoryConfig, rekey
from .hangs import HangTracker
from .intake import BatchIntake, RawInput, intake_group
from .metrics import StreamMetrics
from .ordering import Gaps, Pace, Reorderer, add_gap, take_late
from .outputs import MAX_MESSAGE_BYTES, bounded_anomaly, step_outputs

__all__ = [
    "WORKER_TOPICS",
    "StreamConfig",
    "Streams",
    "Topics",
    "build_app",
    "consumer_groups",
    "own_topics",
]

WORKER_TOPICS = (STEPS, STEP_FINDINGS, STEP_SUMMARIES, ANOMALIES, DEAD_LETTER, HEARTBEATS)
"""The topics a worker reads and writes, created before it starts (its tables' changelogs
and the internal evidence topic are created after, from the app)."""


log = logging.getLogger("argus.streams")
progress = logging.getLogger("argus.streams.progress")
"""A job's progress worth a line in the worker's log at its default level (``argus worker``
shows it unless asked for errors only)."""


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


def _state_key(job: str, run: int) -> bytes:
    """Key of a job run's state in the job-state table."""
    return f"{job}|{run}".encode()


def _held_key(state_key: bytes, step: int) -> bytes:
    """Key of a held step's findings in the held-findings table."""
    return b"%s|%d" % (state_key, step)


def _doc(raw: bytes | None) -> dict[str, Any]:
    """A job-state table value: {"state": JobState dict, "held": [steps], "seen_s": time}."""
    return json.loads(raw) if raw else {}


def _cut_line(text: str, limit: int = 400) -> str:
    """Sender-given text for one log line: at most ``limit`` characters (a hang's summary
    quotes a stack frame as long as the rank sent it), control characters escaped."""
    cut = text if len(text) <= limit else text[: limit - 1] + "…"
    return cut.encode("unicode_escape").decode("ascii", errors="replace") if not cut.isprintable() else cut


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


class Streams:
    """One worker's app: the Faust app, its topics and tables, the pure classes its agents
    call (:class:`StepAssembler`, :class:`Reorderer`, :class:`HangTracker`,
    :class:`EvidenceHistory`), and the agents and timers (the methods below, registered on
    the app by the constructor; ``agents`` maps their names to the Faust agents)."""

    def __init__(self, cfg: StreamConfig) -> None:
        self.cfg = cfg
        self.metrics = StreamMetrics()
        self.app = app = faust_app(cfg)
        self.topics = Topics.declare(app, cfg.partitions)
        self.job_states = app.Table(
            "argus-job-state", default=None, partitions=cfg.partitions, key_type=bytes, value_type=bytes
        )
        self.held_findings = app.Table(
            "argus-held-findings", default=None, partitions=cfg.partitions, key_type=bytes, value_type=bytes
        )
        self.assembler = StepAssembler(cfg.assembly)
        self.reorderer = Reorderer(
            max_held=cfg.max_held_steps,
            max_held_bytes=cfg.max_held_bytes,
            max_wait_s=cfg.reorder_wait_s,
            start_wait_s=cfg.start_wait_s,
        )
        self.hangs = HangTracker(
            cfg.hang,
            rank_slack=cfg.assembly.rank_slack,
            max_groups=cfg.max_groups,
            max_jobs=cfg.max_hang_jobs,
            job_ttl_s=cfg.job_ttl_s,
            update_s=cfg.hang_update_s,
            max_job_stack_bytes=cfg.max_hang_job_stack_bytes,
            max_stack_bytes=cfg.max_hang_stack_bytes,
        )
        groups = consumer_groups(cfg.app_id)
        beats_group, evidence_group = (
            intake_group(cfg.app_id, "heartbeats"),
            intake_group(cfg.app_id, "evidence"),
        )
        self.heartbeat_intake = BatchIntake(
            cfg.kafka_config, beats_group, groups[beats_group], max_batch=cfg.take * 4
        )
        self.evidence_intake = BatchIntake(
            cfg.kafka_config,
            evidence_group,
            groups[evidence_group],
            max_batch=cfg.take * 4,
            max_age_s=cfg.history.max_age_s,
        )
        self.history = EvidenceHistory(cfg.history)
        self.reading = False  # the assemble agent is inside a batch of parts
        self.pending_pops: list[bytes] = []  # held steps diagnosed, out of their table with the state
        # job state key -> the last step the idle refresh sent its anomalies for, and the ids
        # it sent at the kernel level
        self.idle_sent: dict[bytes, tuple[int | None, set[str]]] = {}
        self.skipped: set[Any] = set()  # evidence partitions moved to their end once
        self.origin = [("argus-group", cfg.app_id.encode())]  # which worker group summarized a step
        self.agents = self._register()

    def _register(self) -> dict[str, Any]:
        app, t, cfg = self.app, self.topics, self.cfg
        app.task(self.keep_completing)
        # Timers may read the tables but not write them (Faust: a table key is modified only
        # inside stream iteration): what they decide goes through the findings topic, keyed by
        # job like the job's own steps, and the diagnose agent applies it.
        app.timer(cfg.idle_refresh_s)(self.refresh_idle_jobs)
        app.timer(min(60.0, cfg.job_ttl_s / 2))(self.expire_jobs)
        app.timer(cfg.hang_tick_s)(self.detect_hangs)
        app.task(self.watch_heartbeats)
        app.task(self.watch_evidence)
        sources = {
            "assemble": t.steps,
            "diagnose": t.findings,
            "keep_evidence": t.evidence,
        }
        return {name: app.agent(topic)(getattr(self, name)) for name, topic in sources.items()}

    # -- cross-rank stage ------------------------------------------------------------------

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

    # -- temporal stage ---------------------------------------------------------------------

    async def diagnose(self, stream: Any) -> None:
        async for event in stream.events():
            sf = await self.read_findings(event)
            if sf is not None:
                await self.diagnose_step(event, sf)

    async def read_findings(self, event: Any) -> StepFindings | None:
        """The step's findings; None after a job order (applied here) or bad input."""
        try:
            record = decode(bytes(event.value or b""))
            if isinstance(record, JobOrder):  # from a timer: expire_jobs or refresh_idle_jobs
                if record.action == "release":
                    await self.release_held(record)
                else:
                    self.expire(_state_key(record.job, record.run))
                return None
            if not isinstance(record, StepFindings):
                raise DecodeError(f"expected StepFindings or JobOrder, got {type(record).__name__}")
            check_shape(record)
        except SchemaError as exc:
            await self.dead_letter(event, exc.reason, f"step findings: {exc}")
            return None
        return record

    async def diagnose_step(self, event: Any, sf: StepFindings) -> None:
        """Diagnose the step, and every held step it lets go, in order; then write the job's
        state (after the anomalies it produced are delivered). A step that comes after the
        diagnosis went past it (given up waiting for) still gets its summary."""
        state_key = _state_key(sf.job, sf.run)
        doc = _doc(self.job_states.get(state_key))
        state = JobState.from_dict(doc["state"]) if doc else JobState.new(sf.job, sf.run, self.cfg.diagnoser)
        # Steps that arrived before an earlier one wait in their own table (one small write
        # each); the job's state lists them, and the ranges of steps given up on.
        held: set[int] = set(doc.get("held", ()))
        gaps: Gaps = doc.get("gaps", [])
        held_bytes = int(doc.get("held_bytes", 0))
        pace = Pace.from_list(doc.get("pace"))
        if sf.step in held:
            self.metrics.summaries["duplicate"] += 1  # replayed after a restart: summarized when released
            return
        if sf.step <= state.last_step:
            if not take_late(gaps, sf.step):
                self.metrics.summaries["duplicate"] += 1  # replayed after a restart: summarized already
                return
            # Its job went on without it: too late for the temporal diagnosis, not for its summary.
            await self.summarized(sf, await self.send_summary(sf), "late")
            log.warning(
                "job %.100s run %d: step %d came after the diagnosis went past it (at step %d): "
                "summary sent, not in the job's temporal diagnosis",
                sf.job,
                sf.run,
                sf.step,
                state.last_step,
            )
            self.write_state(state_key, state, held, gaps, held_bytes, pace)
            return
        if state.last_step >= 0 and (
            sf.step > state.last_step + self.cfg.assembly.max_steps_ahead
            or pace.too_far(sf.step, time.time())
        ):
            # Held, it would be released "in order" once it waited long enough, and every
            # real step after it would then look old.
            await self.dead_letter(
                event,
                "far_future",
                f"step {sf.step} is far ahead of step {state.last_step} "
                f"(the job runs {pace.steps_per_s():.1f} steps/s)",
            )
            return
        if doc and not self.reorderer.knows(state_key):
            log.info("job %s: resumed from the table at step %d, %d held", sf.job, state.last_step, len(held))
        raw = bytes(event.value or b"")
        self.reorderer.hold(state_key, held, sf.step, time.monotonic())
        held_bytes = await self.release_in_order(
            state_key, state, held, gaps, held_bytes + len(raw), sf, len(raw)
        )
        if sf.step in held:
            self.held_findings[_held_key(state_key, sf.step)] = raw
        self.write_state(state_key, state, held, gaps, held_bytes, pace)

    async def release_held(self, order: JobOrder) -> None:
        """A timer's order (``release``): diagnose the job's held steps that waited long
        enough, with no new step to let them go (the job ended or hangs after a gap)."""
        state_key = _state_key(order.job, order.run)
        doc = _doc(self.job_states.get(state_key))
        if not doc or not doc.get("held"):
            return
        state = JobState.from_dict(doc["state"])
        held, gaps = set(doc["held"]), doc.get("gaps", [])
        self.reorderer.hold(state_key, held, min(held), time.monotonic())  # restored steps start waiting
        held_bytes = await self.release_in_order(state_key, state, held, gaps, int(doc.get("held_bytes", 0)))
        self.write_state(state_key, state, held, gaps, held_bytes, Pace.from_list(doc.get("pace")))

    async def release_in_order(
        self,
        state_key: bytes,
        state: JobState,
        held: set[int],
        gaps: Gaps,
        held_bytes: int,
        new: StepFindings | None = None,
        new_bytes: int = 0,
    ) -> int:
        """Diagnose the held steps the reorderer lets go (``new``, the step just read and
        counted in ``held_bytes`` with its ``new_bytes``, among them or held with them), in
        order; the held bytes left. Released steps leave the
        held-findings table once the state that diagnosed them is written (by the caller)."""
        now = time.monotonic()
        released: list[int] = []
        while (nxt := self.reorderer.release(state_key, held, state.last_step, now, held_bytes)) is not None:
            if nxt > state.last_step + 1:
                self.give_up(state, gaps, nxt)
            if new is not None and nxt == new.step:
                found: StepFindings | None = new
                held_bytes -= new_bytes
            else:
                released.append(nxt)
                found, size = self.held_step(state_key, nxt, state.job)
                held_bytes -= size
            if found is not None:
                await self.apply(state, found)
            else:  # lost from the table: the next release must not count it as a gap
                state.last_step = nxt
        self.pending_pops.extend(_held_key(state_key, step) for step in released)
        return max(0, held_bytes) if held else 0

    def write_state(
        self, state_key: bytes, state: JobState, held: set[int], gaps: Gaps, held_bytes: int, pace: Pace
    ) -> None:
        """The job's state document into its table, then the held steps it diagnosed out of
        theirs (inside stream iteration)."""
        now = time.time()
        if state.last_step >= 0:
            pace.advance(state.last_step, now)
        doc = {
            "state": state.to_dict(),
            "held": sorted(held),
            "gaps": gaps,
            "pace": pace.to_list(),
            "seen_s": now,
        }
        if held_bytes:
            doc["held_bytes"] = held_bytes
        self.job_states[state_key] = json.dumps(doc).encode()
        for key in self.pending_pops:
            self.held_findings.pop(key, None)
        self.pending_pops.clear()

    def give_up(self, state: JobState, gaps: Gaps, nxt: int) -> None:
        """The diagnosis goes on at ``nxt`` without the steps before it that never came: they
        become a gap (their summaries are sent if they come); counted and logged, except
        before a job's first step (a job resumed mid-run has no earlier steps)."""
        first = state.last_step + 1
        for lo, hi in add_gap(gaps, first, nxt - 1):
            log.info("job %.100s run %d: steps %d-%d no longer awaited", state.job, state.run, lo, hi)
        if state.last_step < 0:
            return
        self.metrics.steps_given_up += nxt - first
        log.warning(
            "job %.100s run %d: steps %d-%d not in after waiting; diagnosis goes on at step %d "
            "(a step of those that comes later gets its summary, not the temporal diagnosis)",
            state.job,
            state.run,
            first,
            nxt - 1,
            nxt,
        )

    def held_step(self, state_key: bytes, step: int, job: str) -> tuple[StepFindings | None, int]:
        """A held step's findings (the message as it came, checked when it came) and its size."""
        held_raw = self.held_findings.get(_held_key(state_key, step)) or b""
        try:
            found: StepFindings = decode(held_raw, expect=StepFindings)
        except SchemaError as exc:  # missing, or held by an older build (JSON)
            self.metrics.summaries["lost"] += 1
            log.warning("job %s: held step %d not in the table (%s); skipped", job, step, exc.reason)
            return None, len(held_raw)
        return found, len(held_raw)

    async def apply(self, state: JobState, found: StepFindings) -> None:
        """One step's findings into the job's state; its summary and anomalies sent and
        delivered (before the state that produced them is written)."""
        deepen = self.history.deepener(found.job, found.run, self.cfg.diagnoser)
        result = apply_findings(state, found, self.cfg.diagnoser, deepen=deepen)
        summary = await self.send_summary(found)
        sent = [(a, await self.send_anomaly(a)) for a in result.anomalies]
        await self.summarized(found, summary, "diagnosed")
        for anomaly, fut in sent:
            if fut is not None and await self.delivered(
                fut, f"anomaly {anomaly.id} of job {anomaly.job:.100}"
            ):
                self.metrics.anomalies[anomaly.cause] += 1

    async def send_summary(self, found: StepFindings) -> Any:
        """Send the step's summary: its delivery future, or None when it cannot be encoded or
        sent (logged, counted ``failed``). Once per step: a step read twice by the
        cross-rank stage, after a rebalance, is a duplicate here and never reaches this."""
        try:
            value = encode(found.summary, check=False)  # checked when its findings were read
            return await self.topics.summaries.send(key=job_key(found.job), value=value, headers=self.origin)
        except (SchemaError, MessageSizeTooLargeError, ProducerSendError, TypeError, ValueError) as exc:
            self.metrics.dead_letters["invalid_output"] += 1
            self.metrics.summaries["failed"] += 1
            log.error("summary of step %d of %.100s not sent: %s", found.step, found.job, str(exc)[:300])
            return None

    async def summarized(self, found: StepFindings, fut: Any, outcome: str) -> None:
        """Wait for a summary's delivery; count the step by ``outcome`` (a key of
        :data:`SUMMARY_OUTCOMES`), or as ``failed`` (logged) when it was not delivered."""
        if fut is not None:
            ok = await self.delivered(fut, f"summary of step {found.step} of {found.job:.100}")
            self.metrics.summaries[outcome if ok else "failed"] += 1

    @staticmethod
    async def delivered(fut: Any, what: str) -> bool:
        """Wait for a send's delivery; False (logged) when the broker did not take it."""
        try:
            await fut
        except Exception as exc:  # KafkaError, or Faust's wrapping of one
            log.error("%s not delivered: %r", what, exc)
            return False
        return True

    def expire(self, state_key: bytes) -> None:
        """Forget a job run silent for ``job_ttl_s`` (inside stream iteration: table writes)."""
        doc = _doc(self.job_states.get(state_key))
        if not doc or doc.get("seen_s", 0) >= time.time() - self.cfg.job_ttl_s:
            return  # it came back meanwhile
        held = doc.get("held", ())
        for step in held:
            self.held_findings.pop(_held_key(state_key, step), None)
        if held:  # the release orders should have let them go long before
            self.metrics.summaries["lost"] += len(held)
            log.warning(
                "job %s: %d held steps forgotten with it, not summarized",
                state_key.decode(errors="replace"),
                len(held),
            )
        del self.job_states[state_key]
        self.reorderer.forget(state_key)
        self.idle_sent.pop(state_key, None)
        self.history.forget(doc["state"]["job"], int(doc["state"]["run"]))
        log.info(
            "job %s: silent for %.0f s, forgotten", state_key.decode(errors="replace"), self.cfg.job_ttl_s
        )

    async def refresh_idle_jobs(self) -> None:
        """Timer: a job that stopped sending steps (ended, or hangs) has its open anomalies
        sent with their windows and costs as far as they went, not as when last sent; and,
        while its kernel sketches may still come (``history.max_age_s``), each confirmed
        anomaly the kernel level has not explained gets another try, sent once explained.
        Steps it holds (waiting for an earlier one) no later step will let go: the temporal
        stage is ordered to release those that waited long enough."""
        now = time.time()
        for key, raw in list(self.job_states.items()):
            doc = _doc(raw)
            if not doc or doc.get("seen_s", 0) > now - self.cfg.idle_refresh_s:
                continue
            state = JobState.from_dict(doc["state"])
            if doc.get("held"):
                order = JobOrder(state.job, state.run, "release")
                await self.topics.findings.send(key=job_key(order.job), value=encode(order))
            last_step, sent = self.idle_sent.get(key, (None, set()))
            again = last_step == state.last_step
            if again and doc["seen_s"] < now - self.cfg.history.max_age_s:
                continue
            self.idle_sent[key] = (state.last_step, sent)
            if not again:  # once per pause of the job: the user's cue that its steps are all diagnosed
                progress.info(
                    "job %.100s run %d: no new step for %.0f s; diagnosed through step %d",
                    state.job,
                    state.run,
                    now - doc.get("seen_s", now),
                    state.last_step,
                )
            deepen = self.history.deepener(state.job, state.run, self.cfg.diagnoser)
            for anomaly in refresh(state, deepen):
                if again and (anomaly.level != "kernel" or anomaly.id in sent):
                    continue  # the table keeps the state as the last step left it: seen already
                if anomaly.level == "kernel":
                    sent.add(anomaly.id)
                if await self.send_anomaly(anomaly) is not None:
                    self.metrics.anomalies[anomaly.cause] += 1

    async def expire_jobs(self) -> None:
        """Timer: order the diagnose agent (through the findings topic) to forget silent jobs."""
        cutoff = time.time() - self.cfg.job_ttl_s
        for raw in list(self.job_states.values()):
            doc = _doc(raw)
            if doc and doc.get("seen_s", 0) < cutoff:
                order = JobOrder(doc["state"]["job"], int(doc["state"]["run"]), "expire")
                await self.topics.findings.send(key=job_key(order.job), value=encode(order))

    # -- hangs ---------------------------------------------------------------------------------

    async def watch_heartbeats(self) -> None:
        """Task: the heartbeats topic, a consumer batch at a time (:mod:`streams.intake`)."""
        await self.keep_reading(self.heartbeat_intake, self.take_heartbeats)

    async def keep_reading(self, intake: BatchIntake, handle: Any) -> None:
        """Run a batch intake for good (an error it cannot get past is logged, then retried)."""
        while True:
            try:
                await intake.run(handle)
            except Exception:  # e.g. settings librdkafka refuses: say so, try again
                log.exception("reading %s failed; again in 5 s", intake.name)
                await asyncio.sleep(5.0)

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

    # -- outputs -----------------------------------------------------------------------------

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


def build_app(cfg: StreamConfig) -> tuple[faust.App, StreamMetrics]:
    """The Faust app and the metrics its agents keep."""
    streams = Streams(cfg)
    return streams.app, streams.metrics
