"""Hostile records on every topic while healthy jobs run, through the real worker, broker,
sink and chDB (issue 17): the healthy jobs lose nothing and are diagnosed as offline, every
hostile record is dead-lettered, nothing crashes. Also: a hung job whose stack has one
very long frame is named (the worker used to die in its hang timer).

``bench/reliability.py`` runs these and tabulates their ``ARGUS-FIGURES`` lines."""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from confluent_kafka import Producer

from argus.detectors import diagnose
from argus.kafka_admin import end_offsets, ensure_topics, read_records, skip_to_end
from argus.producers.publisher import Publisher
from argus.producers.simulator import ClusterSimulator, HangScenario, HangSimulator, Layout
from argus.schemas import (
    ANOMALIES,
    DEAD_LETTER,
    GPU_SAMPLES,
    HEARTBEATS,
    KERNELS,
    STACKS,
    STEP_SUMMARIES,
    STEPS,
    Anomaly,
    StepBatch,
    encode,
    job_key,
    step_key,
)
from argus.simulate import layout_for, parse_fault
from argus.sinks.kafka_sink import KafkaSink
from tests.figures import report
from tests.records import RECORDS, step_batch
from tests.workers import collect, fresh_group, publish

from ..sinks.test_kafka_sink import Borrowed

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

FAULTS = ["compute_straggler@15+15:7"]
STEPS_N, RANKS = 50, 64


def _of(kind: str) -> Any:
    return next(r for r in RECORDS if type(r).__name__ == kind)


def hostile_records(victim: str, unique: str, topics: dict[str, str]) -> list[tuple[str, bytes, bytes]]:
    """(topic, key, value) of one poison record per kind and topic."""
    good = step_batch(8, step=20)
    out: list[tuple[str, bytes, bytes]] = []

    def steps(name: str, batch: StepBatch) -> None:
        out.append((STEPS, step_key(batch.job, batch.step % 1000), encode(batch, check=False)))

    absurd = good.take([0])
    steps("absurd rank", StepBatch(victim, 0, 20, {**absurd.columns, "rank": np.array([(1 << 20) - 1])}))
    steps("far-future step", StepBatch(victim, 0, 10**12 - 1, good.columns))
    steps("long host", StepBatch(victim, 0, 21, {**good.columns, "host": np.array(["h" * 5000] * 8, object)}))
    cols = dict(good.columns)
    cols["forward_ms"] = np.full(8, np.nan)
    steps("NaN", StepBatch(victim, 0, 22, cols))
    cols = dict(good.columns)
    cols["rank"] = np.arange(8) - 1
    steps("negative rank", StepBatch(victim, 0, 23, cols))
    out.append((STEPS, f"{victim}/junk".encode(), b"\x00\x00\x00\x00\x0b" + b"\xab" * 1_000_000))
    beat = dataclasses.replace(_of("Heartbeat"), job=victim, run=0, time_ns=time.time_ns())
    for b in (
        dataclasses.replace(beat, rank=(1 << 20) - 1),
        dataclasses.replace(beat, stack="x" * 70_000),
        dataclasses.replace(beat, time_ns=0),
    ):
        out.append((HEARTBEATS, job_key(victim), encode(b, check=False)))
    for topic, record in (
        ("kernels", dataclasses.replace(_of("KernelSketch"), job=victim, codec=70_000)),
        ("kernels", dataclasses.replace(_of("KernelNames"), job=victim, names=("k" * 5000, "n"))),
        ("stacks", dataclasses.replace(_of("StackSample"), job=victim, counts=(-1, 3))),
        ("gpu", dataclasses.replace(_of("GpuSample"), xid=-1)),
        ("gpu", dataclasses.replace(_of("GpuSample"), ecc_dbe=-7)),
        ("summaries", dataclasses.replace(_of("StepSummary"), job=victim, run=-1)),
        ("summaries", dataclasses.replace(_of("StepSummary"), job=victim, missing=tuple(range(70_000)))),
        ("anomalies", dataclasses.replace(_of("Anomaly"), job=victim, ranks=(-1,))),
        ("anomalies", dataclasses.replace(_of("Anomaly"), job=victim, summary="s" * 10_000)),
        ("dead", dataclasses.replace(_of("DeadLetter"), offset=-1)),
    ):
        out.append((topics[topic], job_key(victim), encode(record, check=False)))
    return out


def test_poison_on_every_topic_while_healthy_jobs_run(kafka_conf, store, worker_factory, unique) -> None:
    victim, control = f"victim-{unique}", f"control-{unique}"
    topics = {k: f"t-{k}-{unique}" for k in ("kernels", "stacks", "gpu", "summaries", "anomalies", "dead")}
    ensure_topics(kafka_conf, list(topics.values()), partitions=2)
    layout = layout_for(RANKS)
    expected = {}
    for job in (victim, control):
        sim = ClusterSimulator(layout, seed=7, job=job, faults=[parse_fault(f, layout) for f in FAULTS])
        expected[job] = {
            (a.cause, a.suspect, a.start_step) for a in diagnose(s.batch for s in sim.run(STEPS_N))
        }
    assert expected[victim]

    sink_group = f"sink-{unique}"
    carries = {"kernels": KERNELS, "stacks": STACKS, "gpu": GPU_SAMPLES, "summaries": STEP_SUMMARIES}
    carries |= {"anomalies": ANOMALIES, "dead": DEAD_LETTER}
    sink_topics = {STEPS: STEPS, DEAD_LETTER: DEAD_LETTER, **{topics[k]: carries[k] for k in topics}}
    skip_to_end(kafka_conf, sink_group, [STEPS, DEAD_LETTER])
    sink = KafkaSink(
        lambda: Borrowed(store), kafka_conf, topics=sink_topics, group=sink_group, batch_seconds=0.3
    )
    stop = threading.Event()
    sinking = threading.Thread(target=sink.run, args=(stop,))
    sinking.start()
    worker = worker_factory(fresh_group(kafka_conf, f"h-{unique}"))

    sent: list[tuple[str, int, int]] = []
    try:
        with ThreadPoolExecutor(2) as pool:
            live = [
                pool.submit(publish, kafka_conf, j, STEPS_N, FAULTS, ranks=RANKS, rate=5.0)
                for j in (victim, control)
            ]
            collect(kafka_conf, victim, until=lambda a, s: len(s) >= 10, timeout=120)
            p = Producer({**kafka_conf, "message.max.bytes": 2_000_000})

            def delivered(err: Any, msg: Any) -> None:
                assert err is None, err
                sent.append((msg.topic(), msg.partition(), msg.offset()))

            hostile = hostile_records(victim, unique, topics)
            for topic, key, value in hostile:
                p.produce(topic, key=key, value=value, on_delivery=delivered)
            assert p.flush(30) == 0
            for f in live:
                f.result()
        found: dict[str, dict[str, Anomaly]] = {}
        summarized: dict[str, set[int]] = {}
        for job in (victim, control):
            want = expected[job]
            found[job], summarized[job] = collect(
                kafka_conf,
                job,
                until=lambda a, s, want=want: (
                    len(s) >= STEPS_N and {(x.cause, x.suspect, x.start_step) for x in a.values()} >= want
                ),
                timeout=180,
            )
        want_rows = STEPS_N * RANKS

        def stored() -> tuple[int, int, set[tuple[str, int, int]]]:
            rows = store.query_rows(
                "SELECT count(), uniqExact(job, step, rank) FROM steps WHERE job IN ({v:String}, {c:String}) "
                # the valid hostile steps (absurd rank, far-future step) are stored as sent: the
                # worker dead-letters them, the sink keeps what the contract allows
                f"AND rank < {RANKS} AND step < {STEPS_N}",
                {"v": victim, "c": control},
            )[0]
            names = sorted({t for t, _, _ in sent})
            dead = store.query_rows(
                "SELECT DISTINCT topic, partition, offset FROM dead_letters WHERE topic IN ("
                + ", ".join(f"{{t{i}:String}}" for i in range(len(names)))
                + ")",
                {f"t{i}": t for i, t in enumerate(names)},
            )
            return int(rows[0]), int(rows[1]), {(str(t), int(p), int(o)) for t, p, o in dead}

        deadline = time.monotonic() + 120
        rows, unique_rows, dead = stored()
        while time.monotonic() < deadline and (unique_rows < 2 * want_rows or not set(sent) <= dead):
            time.sleep(1)
            rows, unique_rows, dead = stored()
        alive = worker.proc.poll() is None and sinking.is_alive()
    finally:
        stop.set()
        sinking.join(60)
    dead_lettered = len(set(sent) & dead)
    diagnosed = {j: {(a.cause, a.suspect, a.start_step) for a in found[j].values()} for j in found}
    report(
        "hostile_every_topic",
        sent=2 * want_rows,
        received=unique_rows,
        lost=2 * want_rows - unique_rows,
        duplicated=rows - unique_rows,
        crashes=int(not alive),
        hostile_records=len(sent),
        dead_lettered=dead_lettered,
    )
    assert alive, "the worker or the sink died"
    assert len(sent) == len(hostile) and dead_lettered == len(sent), sorted(set(sent) - dead)
    assert rows == unique_rows == 2 * want_rows
    assert summarized[victim] == summarized[control] == set(range(STEPS_N))
    assert diagnosed[victim] == expected[victim] and diagnosed[control] == expected[control], diagnosed


def test_a_hung_job_with_a_long_frame_is_named_and_the_worker_lives(
    kafka_conf,
    worker_factory,
    unique,
) -> None:
    """Issue 17, item 2: a 5,000-character innermost frame made a hang summary of 10,128
    characters; encode() raised in the detect_hangs timer and the worker exited."""
    ensure_topics(kafka_conf, [HEARTBEATS, ANOMALIES], partitions=16)
    job = f"long-frame-{unique}"
    worker = worker_factory(fresh_group(kafka_conf, f"lf-{unique}"))
    since = end_offsets(kafka_conf, [ANOMALIES])
    publisher = Publisher(kafka_conf)
    frame = "train.py:step;model.py:" + "f" * 5000
    history_s = 20.0
    sim = HangSimulator(
        Layout(dp=2, tp=4, pp=1),
        HangScenario("collective_hang", at_s=history_s + 5.0, rank=5),
        job=job,
        heartbeat_s=2.0,
        start_ns=time.time_ns() - int(history_s * 1e9),
    )
    sent_to = [sim.start_ns]
    named: list[Anomaly] = []

    def beat_until_named() -> bool:
        """Send the heartbeats due by now (the hang starts 5 s in); True once it was named."""
        now = time.time_ns()
        for beat in sim.beats(sent_to[0], now):
            publisher.publish(HEARTBEATS, job_key(job), dataclasses.replace(beat, stack=frame))
        sent_to[0] = now
        publisher.flush(5)
        return bool(named)

    def take(topic: str, a: Any) -> None:
        if a.job == job:
            named.append(a)

    try:
        read_records(kafka_conf, since, take, until=beat_until_named, timeout=120)
        alive = worker.proc.poll() is None
    finally:
        publisher.shutdown(5)
    found = named[-1] if named else None
    report("hung_job_long_frame", sent=1, received=int(found is not None), lost=int(found is None), duplicated=0,
           crashes=int(not alive))  # fmt: skip
    assert found is not None and alive
    assert found.cause == "hang" and found.ranks == (5,) and len(found.summary) == 4096
