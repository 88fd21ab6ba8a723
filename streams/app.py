"""The Faust app of the stream workers: topics, table and agents, declared once.

Two stages (DESIGN.md):

- **cross-rank** (agent ``assemble``, source ``argus.steps`` keyed by job/step): the parts
  of a step (one StepBatch per host or per rank) meet in one worker and are assembled
  (:mod:`streams.assembly`); the whole step goes through the stateless cross-rank
  detectors (:func:`detectors.step_findings`); the worker publishes the step's summary
  (``argus.step-summaries``) and its findings (``argus.step-findings``, keyed by job).
  Parts are acknowledged only once their step went out, so a killed worker loses nothing:
  Kafka redelivers what was not acknowledged.
- **temporal** (agent ``diagnose``, source ``argus.step-findings`` keyed by job): the
  job's state (iteration baseline, open episodes) lives in a changelog-backed table; each
  step's findings update it (:func:`detectors.apply_findings`) and confirmed episodes go to
  ``argus.anomalies``. Steps are diagnosed in order: a step that arrives before an earlier
  one waits, its findings in a second table (one write each, so a job with many steps
  waiting does not rewrite them all on every step), until the gap fills or times out.
  An anomaly is sent and delivered before the state that produced it is written, and
  anomaly ids are deterministic: after a SIGKILL the restarted worker may send an anomaly
  again, never loses one, and downstream keeps each id once.

- **hangs** (agent ``watch_heartbeats``, source ``argus.heartbeats`` keyed by job): the
  latest heartbeat of every rank of a job in a :class:`detectors.HangState`, fed one
  vectorized pass per job per consumer batch (node relays' HeartbeatBatches and direct
  per-rank Heartbeats alike: :func:`detectors.hang.observe_heartbeats`); a timer
  (``hang_tick_s``, the detector's clock) calls :func:`detectors.detect_hang` for every
  job and sends its hang / lost-rank anomalies to ``argus.anomalies`` (each id when first
  named, then again every ``hang_update_s`` with the cost so far). This state is in
  memory on purpose: it is the last few seconds of heartbeats, rebuilt within one
  heartbeat period after a restart (only the stall clock restarts, so a hang that began
  before the restart is named at most one threshold late); a job's state expires after
  ``job_ttl_s`` without heartbeats.

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
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from aiokafka.errors import MessageSizeTooLargeError

from argus.detectors import (
    DiagnoserConfig,
    HangConfig,
    HangState,
    JobState,
    StepFindings,
    apply_findings,
    detect_hang,
    hang_anomalies,
    observe_heartbeats,
    refresh,
    step_findings,
)
from argus.schemas import (
    ANOMALIES,
    DEAD_LETTER,
    HEARTBEATS,
    KERNELS,
    LIMITS,
    STACKS,
    STEP_FINDINGS,
    STEP_SUMMARIES,
    STEPS,
    Anomaly,
    DeadLetter,
    DecodeError,
    Heartbeat,
    HeartbeatBatch,
    SchemaError,
    StepBatch,
    ValidationError,
    decode_many,
    encode,
    job_key,
)

from .assembly import AssemblyConfig, CompleteStep, StepAssembler
from .deepening import EVIDENCE_TOPIC, EvidenceHistory, HistoryConfig, rekey
from .ordering import next_in_order

__all__ = [
    "MAX_MESSAGE_BYTES",
    "StreamConfig",
    "StreamMetrics",
    "bounded_anomaly",
    "build_app",
    "step_outputs",
]

MAX_MESSAGE_BYTES = 900_000
"""Largest value the worker sends: below the producer's 1 MiB request limit, with room for
the key and headers."""

log = logging.getLogger("argus.streams")


@dataclass(frozen=True)
class StreamConfig:
    """Everything a worker needs; built from ARGUS_* settings by the composition root."""

    broker: str = "kafka://127.0.0.1:9092"
    credentials: Any = None
    app_id: str = "argus-streams"
    partitions: int = 16
    store: str = "memory://"
    datadir: str = ".argus/streams"
    take: int = 512
    within_s: float = 0.05
    assembly: AssemblyConfig = field(default_factory=AssemblyConfig)
    diagnoser: DiagnoserConfig = field(default_factory=DiagnoserConfig)
    job_ttl_s: float = 6 * 3600.0
    max_held_steps: int = 64
    reorder_wait_s: float = 30.0
    start_wait_s: float = 5.0
    session_timeout_s: float = 15.0
    """A worker that stops heartbeating (killed) loses its partitions after this long."""
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
    history: HistoryConfig = field(default_factory=HistoryConfig)
    """The kernel sketches and stack samples kept per rank for the kernel level."""


@dataclass
class StreamMetrics:
    """Counters a worker exposes on /metrics (and tests read)."""

    records: int = 0
    messages: int = 0
    steps: Counter[str] = field(default_factory=Counter)
    anomalies: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    completion_s: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    open_steps: int = 0
    heartbeats: int = 0
    hang_jobs: int = 0
    started: float = field(default_factory=time.monotonic)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clamp(value: float, lo: float) -> float:
    return min(max(float(value), lo), 1e30) if value == value else 0.0  # NaN -> 0


def bounded_anomaly(a: Anomaly) -> Anomaly:
    """The anomaly with every field cut to what validation allows (as the step path's
    summary already is): summary 4,096 characters, names and evidence keys 256, at most
    ``LIMITS["max_listed_ranks"]`` ranks (what the engine lists), window and figures
    clamped to their ranges; non-finite evidence dropped. A hang's summary quotes the hung
    frame, which is as long as the rank's stack says."""
    ids, names, last = LIMITS["max_id_len"], LIMITS["max_name_len"], LIMITS["max_step"] - 1
    evidence = {_cut(str(k), ids): float(v) for k, v in a.evidence.items() if abs(float(v)) <= 1e30}
    start = min(max(a.start_step, 0), last)
    return dataclasses.replace(
        a,
        start_step=start,
        end_step=min(max(a.end_step, start), last),
        score=_clamp(a.score, 0.0),
        step_ms_added=_clamp(a.step_ms_added, -1e30),
        gpu_hours_lost=_clamp(a.gpu_hours_lost, -1e30),
        detected_ns=min(max(a.detected_ns, 0), LIMITS["max_time_ns"] - 1),
        id=a.id[:ids],
        suspect=_cut(a.suspect, ids),
        suspect_kind=a.suspect_kind[:ids],
        cause=a.cause[:ids],
        summary=_cut(a.summary, names),
        ranks=tuple(a.ranks[: LIMITS["max_listed_ranks"]]),
        evidence=evidence,
    )


def step_outputs(
    done: CompleteStep, config: DiagnoserConfig, max_bytes: int = MAX_MESSAGE_BYTES
) -> tuple[StepFindings, bytes, bytes]:
    """The cross-rank stage's output for one complete step: its findings, the encoded step
    summary and the findings message (pure; the worker sends both).

    Raises :class:`ValidationError` when either would exceed ``max_bytes`` or the summary is
    out of range (the worker dead-letters the step's parts then).
    """
    sf = step_findings(done.batch, config, missing=done.missing)
    summary = encode(sf.summary)
    findings = json.dumps(sf.to_dict()).encode()
    if max(len(summary), len(findings)) > max_bytes:
        raise ValidationError(
            f"step {sf.step} of {sf.job}: summary of {len(summary)} bytes and findings of "
            f"{len(findings)} bytes, limit {max_bytes}"
        )
    return sf, summary, findings


_EXPIRE = "expire_job"
"""A findings-topic message that orders the diagnose agent to forget a silent job run."""


def _held_key(state_key: bytes, step: int) -> bytes:
    """Key of a held step's findings in the held-findings table."""
    return b"%s|%d" % (state_key, step)


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


def build_app(cfg: StreamConfig) -> tuple[faust.App, StreamMetrics]:
    """The Faust app and the metrics its agents keep."""
    Path(cfg.datadir).mkdir(parents=True, exist_ok=True)
    app = faust.App(
        cfg.app_id,
        broker=cfg.broker,
        broker_credentials=cfg.credentials,
        store=cfg.store,
        datadir=cfg.datadir,
        topic_partitions=cfg.partitions,
        topic_replication_factor=1,
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
    metrics = StreamMetrics()
    steps_topic = app.topic(STEPS, key_type=bytes, value_type=bytes, partitions=cfg.partitions)
    findings_topic = app.topic(STEP_FINDINGS, key_type=bytes, value_type=bytes, partitions=cfg.partitions)
    summaries_topic = app.topic(STEP_SUMMARIES, key_type=bytes, value_type=bytes)
    anomalies_topic = app.topic(ANOMALIES, key_type=bytes, value_type=bytes)
    dead_topic = app.topic(DEAD_LETTER, key_type=bytes, value_type=bytes)
    job_states = app.Table(
        "argus-job-state", default=None, partitions=cfg.partitions, key_type=bytes, value_type=bytes
    )
    assembler = StepAssembler(cfg.assembly)
    held_findings = app.Table(
        "argus-held-findings", default=None, partitions=cfg.partitions, key_type=bytes, value_type=bytes
    )
    holding: dict[bytes, dict[int, float]] = {}  # job state key -> held step -> since (monotonic)
    history = EvidenceHistory(cfg.history)

    async def dead_letter(event: Any, reason: str, error: str) -> None:
        """Send one input to the dead-letter topic (bounded) and wait until it is delivered."""
        msg = event.message
        metrics.dead_letters[reason] += 1
        log.warning(
            "dead letter %s[%d]@%d: %s: %s", msg.topic, msg.partition, msg.offset, reason, error[:300]
        )
        payload = bytes(event.value or b"")
        record = DeadLetter.of(msg.topic, msg.partition, msg.offset, reason, error, time.time_ns(), payload)
        key = bytes(msg.key or b"")[:1024]
        fut = await dead_topic.send(
            key=key,
            value=encode(record),
            headers=[
                ("argus-reason", record.reason.encode()),
                ("argus-error", error[:500].encode(errors="replace")),
                ("argus-size", str(len(payload)).encode()),
            ],
        )
        await fut

    async def reject(events: Any, reason: str, error: str) -> None:
        for event in events:
            await dead_letter(event, reason, error)
            event.ack()

    origin = [("argus-group", cfg.app_id.encode())]  # which worker group summarized a step

    async def finish(done: CompleteStep) -> None:
        metrics.steps[done.reason] += 1
        if done.rejected:
            await reject(done.rejected, "absurd_rank", "the part claims only ranks beyond the job's world")
        if done.reason == "far_future":
            frontier = "its last completed step"
            await reject(done.tokens, "far_future", f"step {done.batch.step} is far ahead of {frontier}")
            return
        if done.reason not in ("late", "absurd_rank"):
            reason, error = "", ""
            try:
                sf, summary, findings = step_outputs(done, cfg.diagnoser, cfg.max_message_bytes)
            except ValidationError as exc:
                reason, error = "output_too_large", str(exc)
            except Exception as exc:  # a detector bug on odd input must not stop the worker
                log.exception("step %d of %s: diagnosis failed", done.batch.step, done.batch.job)
                reason, error = "diagnosis_failed", repr(exc)
            else:
                key = job_key(done.batch.job)
                try:
                    sent = [
                        await summaries_topic.send(key=key, value=summary, headers=origin),
                        await findings_topic.send(key=key, value=findings, headers=origin),
                    ]
                    for fut in sent:
                        await fut  # delivered before the parts are acknowledged
                except MessageSizeTooLargeError as exc:
                    reason, error = "output_too_large", repr(exc)
                else:
                    metrics.completion_s.append(max(0.0, (time.time_ns() - sf.end_ns) / 1e9))
            if reason:
                await reject(done.tokens, reason, error)
                return
        for event in done.tokens:
            event.ack()

    async def send_anomaly(anomaly: Anomaly) -> Any:
        """Send one anomaly (bounded); None when it cannot be encoded or sent (logged, counted)."""
        try:
            value = encode(bounded_anomaly(anomaly))
            return await anomalies_topic.send(key=job_key(anomaly.job)[:1024], value=value)
        except (SchemaError, MessageSizeTooLargeError, TypeError, ValueError) as exc:
            metrics.dead_letters["invalid_output"] += 1
            log.error("anomaly %s of job %.100s not sent: %s", anomaly.id, anomaly.job, str(exc)[:300])
            return None

    reading = [False]  # the assemble agent is inside a batch of parts

    @app.agent(steps_topic)
    async def assemble(stream: Any) -> None:
        async for events in stream.take_events(cfg.take, within=cfg.within_s):
            reading[0] = True
            now = time.monotonic()
            # One decode for the whole batch of events: its StepBatches are checked in one pass.
            parts = decode_many([event.value or b"" for event in events], expect=StepBatch)
            for event, part in zip(events, parts, strict=True):
                metrics.messages += 1
                if isinstance(part, SchemaError):
                    await dead_letter(event, part.reason, str(part))
                    continue
                # take_events acknowledges the whole batch once we are done with it (noack()
                # does not change that); a part of a step still open must stay unacknowledged,
                # so hold a reference of our own, released in finish().
                event.message.incref()
                metrics.records += len(part)
                for done in assembler.add(part, event, now):
                    await finish(done)
            for done in assembler.due(now) if not (app.rebalancing or app.should_stop) else ():
                await finish(done)
            reading[0] = False
            metrics.open_steps = assembler.open_steps

    @app.timer(0.25)  # type: ignore[untyped-decorator]
    async def complete_waiting() -> None:
        if reading[0]:
            return  # mid-batch, a step's next parts may be further on in it; the agent checks at its end
        if app.rebalancing or app.should_stop:  # the partitions go elsewhere (or back): read again there
            dropped = assembler.drop_open()
            if dropped:
                _forget_unacked(app, dropped)
                log.info("rebalance: %d parts of open steps dropped, unacknowledged", len(dropped))
            metrics.open_steps = 0
            return
        for done in assembler.due(time.monotonic()):
            await finish(done)
        metrics.open_steps = assembler.open_steps

    def expire(state_key: bytes) -> None:
        """Forget a job run silent for ``job_ttl_s`` (inside stream iteration: table writes)."""
        raw = job_states.get(state_key)
        doc = json.loads(raw) if raw else {}
        if not doc or doc.get("seen_s", 0) >= time.time() - cfg.job_ttl_s:
            return  # it came back meanwhile
        for step in doc.get("held", ()):
            held_findings.pop(_held_key(state_key, step), None)
        del job_states[state_key]
        holding.pop(state_key, None)
        refreshed.pop(state_key, None)
        history.forget(doc["state"]["job"], int(doc["state"]["run"]))
        log.info("job %s: silent for %.0f s, forgotten", state_key.decode(errors="replace"), cfg.job_ttl_s)

    @app.agent(findings_topic)
    async def diagnose(stream: Any) -> None:
        async for event in stream.events():
            raw = bytes(event.value or b"")
            try:
                data = json.loads(raw)
                if isinstance(data, dict) and _EXPIRE in data:  # from expire_jobs
                    expire(f"{data[_EXPIRE]}|{int(data['run'])}".encode())
                    continue
                sf = StepFindings.from_dict(data)
            except (ValueError, KeyError, TypeError) as exc:
                await dead_letter(event, "invalid", f"step findings: {exc}")
                continue
            state_key = f"{sf.job}|{sf.run}".encode()
            doc_raw = job_states.get(state_key)
            doc = json.loads(doc_raw) if doc_raw else {}
            state = JobState.from_dict(doc["state"]) if doc else JobState.new(sf.job, sf.run, cfg.diagnoser)
            # Steps that arrived before an earlier one wait in their own table (one small write
            # each); the job's state lists them.
            held: set[int] = set(doc.get("held", ()))
            if sf.step <= state.last_step or sf.step in held:
                continue  # a duplicate (replayed after a restart): already diagnosed or held
            if state.last_step >= 0 and sf.step > state.last_step + cfg.assembly.max_steps_ahead:
                # Held, it would be released "in order" once it waited long enough, and every
                # real step after it would then look old.
                await dead_letter(
                    event, "far_future", f"step {sf.step} is far ahead of step {state.last_step}"
                )
                continue
            if doc and state_key not in holding:
                log.info(
                    "job %s: resumed from the table at step %d, %d held", sf.job, state.last_step, len(held)
                )
            now = time.monotonic()
            held.add(sf.step)
            # How long a step waited counts on this process's clock: a step restored from the
            # changelog starts waiting afresh, so the steps replayed after it can still come.
            since = holding.setdefault(state_key, {})
            for h in held:
                since.setdefault(h, now)
            released: list[int] = []
            while True:
                nxt = next_in_order(
                    state.last_step,
                    held,
                    max_held=cfg.max_held_steps,
                    waited_s=now - min(since[s] for s in held) if held else 0.0,
                    max_wait_s=cfg.reorder_wait_s,
                    start_wait_s=cfg.start_wait_s,
                )
                if nxt is None:
                    break
                held.discard(nxt)
                since.pop(nxt, None)
                released.append(nxt)
                if nxt == sf.step:
                    found = sf
                else:
                    held_raw = held_findings.get(_held_key(state_key, nxt))
                    if held_raw is None:
                        log.warning("job %s: held step %d is missing from the table; skipped", sf.job, nxt)
                        continue
                    found = StepFindings.from_dict(json.loads(held_raw))
                deepen = history.deepener(found.job, found.run, cfg.diagnoser)
                result = apply_findings(state, found, cfg.diagnoser, deepen=deepen)
                for anomaly in result.anomalies:
                    if await send_anomaly(anomaly) is not None:
                        metrics.anomalies[anomaly.cause] += 1
                if result.anomalies:
                    await app.producer.flush()  # delivered before the state that produced them is written
            if sf.step in held:
                held_findings[_held_key(state_key, sf.step)] = raw
            job_states[state_key] = json.dumps(
                {"state": state.to_dict(), "held": sorted(held), "seen_s": time.time()}
            ).encode()
            for step in released:
                if step != sf.step:
                    held_findings.pop(_held_key(state_key, step), None)

    # Timers may read the tables but not write them (Faust: a table key is modified only
    # inside stream iteration): what they decide goes through the findings topic, keyed by
    # job like the job's own steps, and the diagnose agent applies it.
    refreshed: dict[bytes, int] = {}  # job state key -> the last step its anomalies were sent for

    @app.timer(cfg.idle_refresh_s)  # type: ignore[untyped-decorator]
    async def refresh_idle_jobs() -> None:
        # a job that stopped sending steps (ended, or hangs): its open anomalies' windows
        # and costs as far as they went, not as they were when last sent
        quiet = time.time() - cfg.idle_refresh_s
        for key, raw in list(job_states.items()):
            doc = json.loads(raw) if raw else {}
            if not doc or doc.get("seen_s", 0) > quiet:
                continue
            state = JobState.from_dict(doc["state"])
            if refreshed.get(key) == state.last_step:
                continue
            refreshed[key] = state.last_step
            for anomaly in refresh(state):
                if await send_anomaly(anomaly) is not None:
                    metrics.anomalies[anomaly.cause] += 1

    @app.timer(min(60.0, cfg.job_ttl_s / 2))  # type: ignore[untyped-decorator]
    async def expire_jobs() -> None:
        cutoff = time.time() - cfg.job_ttl_s
        for raw in list(job_states.values()):
            doc = json.loads(raw) if raw else {}
            if doc and doc.get("seen_s", 0) < cutoff:
                state = doc["state"]
                order = json.dumps({_EXPIRE: state["job"], "run": state["run"]}).encode()
                await findings_topic.send(key=job_key(state["job"]), value=order)

    heartbeats_topic = app.topic(HEARTBEATS, key_type=bytes, value_type=bytes, partitions=cfg.partitions)
    hang_states: dict[tuple[str, int], HangState] = {}
    hang_sent: dict[str, float] = {}  # anomaly id -> when last sent (monotonic)

    @app.agent(heartbeats_topic)
    async def watch_heartbeats(stream: Any) -> None:
        async for events in stream.take_events(cfg.take, within=cfg.within_s):
            records = []
            for event, record in zip(events, decode_many([e.value or b"" for e in events]), strict=True):
                if isinstance(record, Heartbeat | HeartbeatBatch):
                    records.append((record, event))
                else:  # a SchemaError, or a record of another type
                    bad = record if isinstance(record, SchemaError) else DecodeError(type(record).__name__)
                    await dead_letter(event, bad.reason, f"not a heartbeat: {bad}")
            taken, refused = observe_heartbeats(
                hang_states,
                records,
                rank_slack=cfg.assembly.rank_slack,
                max_groups=cfg.max_groups,
                progress_points=cfg.hang.progress_points,
                max_jobs=cfg.max_hang_jobs,
            )
            for event, reason, error in refused:
                await dead_letter(event, reason, error)
            metrics.heartbeats += taken
            metrics.hang_jobs = len(hang_states)

    @app.timer(cfg.hang_tick_s)  # type: ignore[untyped-decorator]
    async def detect_hangs() -> None:
        now_ns, now = time.time_ns(), time.monotonic()
        for key, state in list(hang_states.items()):
            if state.seen.any() and now_ns - int(state.time_ns.max()) > cfg.job_ttl_s * 1e9:
                del hang_states[key]
                continue
            try:
                anomalies = hang_anomalies(detect_hang(state, now_ns, cfg.hang))
            except Exception:  # one job's odd heartbeats must not stop the others' detection
                log.exception("hang detection for job %.100s failed", key[0])
                continue
            for anomaly in anomalies:
                last = hang_sent.get(anomaly.id)
                if last is not None and now - last < cfg.hang_update_s:
                    continue
                fut = await send_anomaly(anomaly)
                if fut is None:
                    hang_sent[anomaly.id] = now  # not again before the next update
                    continue
                await fut
                if last is None:
                    metrics.anomalies[anomaly.cause] += 1
                    log.warning("hang: %s", anomaly.summary)
                hang_sent[anomaly.id] = now
        for aid in [a for a, t in hang_sent.items() if now - t > cfg.job_ttl_s]:
            del hang_sent[aid]

    # Kernel level (streams/deepening.py): kernel sketches and stacks, keyed by rank, re-keyed
    # by job into a topic co-partitioned with the findings; kept a few steps per rank.
    # Best effort (acks=False): a partition first seen with messages older than
    # history.max_age_s (a new group on the topics' backlog) is moved to its end, once.
    evidence_topic = app.topic(
        EVIDENCE_TOPIC, key_type=bytes, value_type=bytes, partitions=cfg.partitions, internal=True, acks=False
    )
    skipped: set[Any] = set()

    async def recent_only(events: list[Any]) -> list[Any]:
        recent = time.time() - cfg.history.max_age_s
        stale = {e.message.tp for e in events if e.message.timestamp < recent} - skipped
        if stale:
            skipped.update(stale)
            for tp, end in (await app.consumer.highwaters(*stale)).items():
                await app.consumer.seek(tp, end)
        return [e for e in events if e.message.timestamp >= recent]

    @app.agent(app.topic(KERNELS, STACKS, key_type=bytes, value_type=bytes, acks=False))
    async def rekey_evidence(stream: Any) -> None:
        async for events in stream.take_events(cfg.take, within=cfg.within_s):
            fresh = await recent_only(events)
            out, bad = rekey([(e.message.key, bytes(e.value or b"")) for e in fresh], cfg.max_message_bytes)
            for i, exc in bad:
                await dead_letter(fresh[i], exc.reason, str(exc))
            for key, blob in out:  # queued, not awaited: the history is best effort
                await app.producer.send(EVIDENCE_TOPIC, key, blob, None, None, None)

    @app.agent(evidence_topic)
    async def keep_evidence(stream: Any) -> None:
        async for events in stream.take_events(cfg.take, within=cfg.within_s):
            history.add_packed([e.value for e in await recent_only(events)])

    app.argus_agents = (assemble, diagnose, watch_heartbeats, rekey_evidence, keep_evidence)  # type: ignore[attr-defined]
    return app, metrics
