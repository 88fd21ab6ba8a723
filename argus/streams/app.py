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
configurations in one process. The stages' methods live in modules of their own, mixed into
:class:`Streams` (Faust's "Projects and Directory Layout": topics, tables and agents apart
around one app): the configuration and the Faust app (:mod:`.config`), the topics and
consumer groups (:mod:`.topics`), the cross-rank stage (:mod:`._cross_rank`), the batch
intakes' hang and kernel-level tasks (:mod:`._side_inputs`) and the outputs they share
(:mod:`._sending`); the temporal stage and the job-state tables are here.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import faust
from aiokafka.errors import MessageSizeTooLargeError
from faust.exceptions import ProducerSendError

from argus.detectors import JobState, apply_findings, check_shape, refresh
from argus.schemas import (
    DecodeError,
    JobOrder,
    SchemaError,
    StepFindings,
    decode,
    encode,
    job_key,
)

from ._cross_rank import CrossRankStage
from ._side_inputs import SideInputs
from .assembly import StepAssembler
from .config import StreamConfig, faust_app
from .deepening import EvidenceHistory
from .hangs import HangTracker
from .intake import BatchIntake, intake_group
from .metrics import StreamMetrics
from .ordering import Gaps, Pace, Reorderer, add_gap, take_late
from .topics import WORKER_TOPICS, Topics, consumer_groups, own_topics

__all__ = [
    "WORKER_TOPICS",
    "StreamConfig",
    "Streams",
    "Topics",
    "build_app",
    "consumer_groups",
    "own_topics",
]

log = logging.getLogger("argus.streams")
progress = logging.getLogger("argus.streams.progress")
"""A job's progress worth a line in the worker's log at its default level (``argus worker``
shows it unless asked for errors only)."""


def _state_key(job: str, run: int) -> bytes:
    """Key of a job run's state in the job-state table."""
    return f"{job}|{run}".encode()


def _held_key(state_key: bytes, step: int) -> bytes:
    """Key of a held step's findings in the held-findings table."""
    return b"%s|%d" % (state_key, step)


def _doc(raw: bytes | None) -> dict[str, Any]:
    """A job-state table value: {"state": JobState dict, "held": [steps], "seen_s": time}."""
    return json.loads(raw) if raw else {}


class Streams(CrossRankStage, SideInputs):
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
            held_key = _held_key(state_key, sf.step)
            if self.held_findings.get(held_key) is None:
                # The state that lists it was written, its copy was not (a worker killed
                # between the two table writes): the replay is the copy.
                self.held_findings[held_key] = bytes(event.value or b"")
                log.info(
                    "job %.100s run %d: held step %d taken again from its replay", sf.job, sf.run, sf.step
                )
            else:
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


def build_app(cfg: StreamConfig) -> tuple[faust.App, StreamMetrics]:
    """The Faust app and the metrics its agents keep."""
    streams = Streams(cfg)
    return streams.app, streams.metrics
