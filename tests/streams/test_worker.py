"""The stream worker as users run it (`argus worker`), on the real broker."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, ConfigResource

from argus.detectors import diagnose
from argus.producers.simulator import ClusterSimulator
from argus.schemas import (
    STEP_FINDINGS,
    STEPS,
)
from argus.simulate import layout_for, parse_fault
from tests.figures import report
from tests.workers import collect, fresh_group, publish

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_one_straggler_yields_one_anomaly_and_a_clean_job_none(kafka_conf, worker_factory, unique) -> None:
    slow, clean = f"e2e-slow-{unique}", f"e2e-clean-{unique}"
    app = fresh_group(kafka_conf, f"t-{unique}")
    publish(kafka_conf, slow, 40, ["compute_straggler@15+15:77"])
    publish(kafka_conf, clean, 40, [])
    worker_factory(app)
    found, steps = collect(
        kafka_conf, slow, until=lambda a, s: len(s) >= 40 and any(x.end_step >= 29 for x in a.values())
    )
    assert len(steps) == 40
    assert len(found) == 1, [(a.cause, a.suspect) for a in found.values()]
    (anomaly,) = found.values()
    assert (anomaly.cause, anomaly.suspect, anomaly.start_step) == ("compute_straggler", "rank:77", 15)
    assert anomaly.gpu_hours_lost > 0 and "compute_ms_z" in anomaly.evidence
    none, clean_steps = collect(kafka_conf, clean, until=lambda a, s: len(s) >= 40, timeout=60)
    assert len(clean_steps) == 40 and none == {}
    # The tables' changelog topics are compacted and co-partitioned with the findings topic
    # (the worker creates them so before Faust starts; see argus/cli/worker.py).
    admin = AdminClient(kafka_conf)
    topics = admin.list_topics(timeout=10).topics
    names = [f"{app}-argus-job-state-changelog", f"{app}-argus-held-findings-changelog"]
    assert all(len(topics[n].partitions) == len(topics[STEP_FINDINGS].partitions) for n in names)
    for resource, fut in admin.describe_configs([ConfigResource("topic", n) for n in names]).items():
        assert fut.result(10)["cleanup.policy"].value == "compact", resource


def test_a_job_that_ends_mid_fault_gets_its_final_window_and_is_forgotten_without_a_crash(
    kafka_conf, worker_factory, unique, monkeypatch
) -> None:
    """The straggler is still slow at the job's last step: no step will close its anomaly,
    so the worker sends it as far as it went once the job is quiet; later the job's state
    expires. Both happen in timers, which may not write Faust tables: the worker lives."""
    job = f"e2e-ends-{unique}"
    app = fresh_group(kafka_conf, f"t-{unique}")
    monkeypatch.setenv("ARGUS_STREAMS_JOB_TTL_S", "8")
    worker = worker_factory(app)
    publish(kafka_conf, job, 40, ["compute_straggler@15+100:77"])
    found, _ = collect(
        kafka_conf, job, until=lambda a, s: any(x.end_step == 39 for x in a.values()), timeout=90
    )
    (anomaly,) = found.values()
    assert (anomaly.suspect, anomaly.start_step, anomaly.end_step) == ("rank:77", 15, 39)
    time.sleep(15)  # past the job's TTL: the expire order went through the findings topic
    assert worker.proc.poll() is None, "the worker died"
    worker.log.flush()
    log = Path(worker.log.name).read_text()
    assert "Traceback" not in log and "Cannot modify table" not in log, log[-2000:]
    # the user's cue, at the worker's default log level, that the job is diagnosed to its end
    assert f"job {job} run 0: no new step for" in log and "diagnosed through step 39" in log, log[-2000:]
    # forgotten: the job's state has a tombstone in the table's changelog
    c = Consumer({**kafka_conf, "group.id": f"peek-{time.time_ns()}", "auto.offset.reset": "earliest"})
    c.subscribe([f"{app}-argus-job-state-changelog"])
    key, tombstone, deadline = f"{job}|0".encode(), False, time.monotonic() + 30
    try:
        while not tombstone and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                if not m.error() and m.key() == key and m.value() is None:
                    tombstone = True
    finally:
        c.close()
    assert tombstone, "the silent job's state was not dropped"


def test_sigkill_and_restart_emit_the_same_anomalies(kafka_conf, worker_factory, unique) -> None:
    job = f"e2e-kill-{unique}"
    app = fresh_group(kafka_conf, f"k-{unique}")
    faults = [
        "compute_straggler@12+10:40",
        "dataloader_stall@30:200",
        "gc_pause@45:9",
        "compute_straggler@50+8:131",
    ]
    layout = layout_for(256)
    # The uninterrupted run: the same simulation diagnosed offline.
    sim = ClusterSimulator(
        layout, seed=7, job=job, faults=[parse_fault(f, layout) for f in faults], checkpoint_every=0
    )
    offline = diagnose(s.batch for s in sim.run(70))
    expected = {a.id for a in offline}
    assert len(expected) == 4

    first = worker_factory(app, "--loglevel", "info")
    with ThreadPoolExecutor(1) as pool:  # a live job: 10 steps/s while the worker runs
        publishing = pool.submit(publish, kafka_conf, job, 70, faults, rate=10.0)
        collect(kafka_conf, job, until=lambda a, s: len(s) >= 25, timeout=120)
        first.kill()  # SIGKILL mid-run: no shutdown, nothing flushed
        worker_factory(
            app, "--loglevel", "info"
        )  # the same group: it resumes from what the killed one committed
        publishing.result()
    found, steps = collect(
        kafka_conf, job, until=lambda a, s: len(s) >= 70 and set(a) >= expected, timeout=180
    )
    report(
        "worker_crash",
        sent=len(expected),
        received=len(set(found) & expected),
        lost=len(expected - set(found)),
        duplicated=len(set(found) - expected),
    )
    described = sorted((a.cause, a.suspect, a.start_step) for a in found.values())
    assert set(found) == expected, (described, sorted((a.cause, a.suspect, a.start_step) for a in offline))
    assert steps == set(range(70))  # steps open in the killed worker were assembled again, none lost


def test_garbage_on_the_steps_topic_goes_to_dead_letters_and_the_worker_goes_on(
    kafka_conf, worker_factory, unique
) -> None:
    import numpy as np
    from confluent_kafka import Producer

    from argus.schemas import DEAD_LETTER, StepBatch, encode, step_key
    from tests.records import step_batch

    good = step_batch(8)
    nan = dict(good.columns)
    nan["forward_ms"] = np.full(8, np.nan)
    huge = dict(good.columns)
    huge["rank"] = np.arange(8) + 10_000_000
    hostile = [
        b"",
        b"\x00\x00\x00\x03\xe7garbage",  # unknown schema id
        bytes(range(256)) * 8,  # magic 0, then schema id 0x01020304
        encode(StepBatch(f"bad-{unique}", 0, 1, nan), check=False),
        encode(StepBatch(f"bad-{unique}", 0, 2, huge), check=False),
    ]
    app = fresh_group(kafka_conf, f"g-{unique}")
    p = Producer(kafka_conf)
    for i, value in enumerate(hostile):
        p.produce(STEPS, key=step_key(f"bad-{unique}", i), value=value)
    assert p.flush(20) == 0
    job = f"after-garbage-{unique}"
    publish(kafka_conf, job, 12, [])
    port = 19500 + int(unique[:4], 16) % 400
    worker = worker_factory(app, "--metrics-port", str(port))
    _, steps = collect(kafka_conf, job, until=lambda a, s: len(s) >= 12, timeout=120)
    assert len(steps) == 12 and worker.proc.poll() is None  # it went on, it did not crash
    c = Consumer({**kafka_conf, "group.id": f"dlq-{unique}", "auto.offset.reset": "earliest"})
    c.subscribe([DEAD_LETTER])
    reasons: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(reasons) < len(hostile):
        for m in c.consume(500, timeout=0.5):
            if not m.error() and m.key() and m.key().startswith(f"bad-{unique}".encode()):
                reasons.append(dict(m.headers() or [])["argus-reason"].decode())
    c.close()
    assert sorted(reasons) == sorted(["decode", "unknown_schema", "unknown_schema", "invalid", "invalid"])
    report(
        "hostile_steps_topic",
        sent=len(hostile),
        received=len(reasons),
        lost=len(hostile) - len(reasons),
        duplicated=0,
        crashes=int(worker.proc.poll() is not None),
        hostile_records=len(hostile),
        dead_lettered=len(reasons),
    )
