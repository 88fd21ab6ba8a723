"""Acceptance: 4 real gloo ranks with the agent; one blocks on a lock before an all-reduce.
The heartbeats it and its peers keep sending through the real broker name that rank and
the all-reduce its peers wait in."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from argus.detectors import HANG, HangState, detect_hang, hang_anomalies
from argus.schemas import HEARTBEATS, Heartbeat, decode
from tests.helpers.kafka import start_offsets
from tests.helpers.net import free_port

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

HANG_RANK, HANG_STEP, WORLD = 2, 6, 4


def test_a_rank_blocked_before_an_all_reduce_is_named_with_the_all_reduce(kafka_conf, unique, tmp_path):
    from confluent_kafka import Consumer

    job = f"gloo-hang-{unique}"
    assignment = start_offsets(kafka_conf, [HEARTBEATS])
    port = str(free_port())
    args = [
        "--steps",
        "200",
        "--job",
        job,
        "--bootstrap",
        kafka_conf["bootstrap.servers"],
        "--home",
        str(tmp_path),
    ]
    args += ["--hang-rank", str(HANG_RANK), "--hang-step", str(HANG_STEP)]
    procs = []
    consumer = Consumer({**kafka_conf, "group.id": f"argus-test-{job}", "enable.auto.commit": False})
    try:
        for r in range(WORLD):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
            env.update(
                RANK=str(r),
                WORLD_SIZE=str(WORLD),
                LOCAL_RANK=str(r),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "argus.examples.train_ddp", *args],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        consumer.assign(assignment)
        state = HangState(job)
        verdict = None
        deadline = time.monotonic() + 75
        while time.monotonic() < deadline:
            beats = [decode(m.value()) for m in consumer.consume(500, 0.5) if not m.error()]
            state.observe([b for b in beats if isinstance(b, Heartbeat)])
            verdict = detect_hang(state, time.time_ns())
            if verdict.hung:
                break
        assert all(p.poll() is None for p in procs), "a rank exited: the job did not hang"
    finally:
        consumer.close()
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(30)
    assert verdict is not None and verdict.hung, f"no hang named (max step {state.max_step})"
    assert state.max_step == HANG_STEP - 1
    (f,) = verdict.findings
    assert (f.cause, f.suspect_kind, f.suspect, f.ranks) == (HANG, "rank", f"rank:{HANG_RANK}", (HANG_RANK,))
    assert f.kind == "all_reduce" and f.group == "world" and f.waiting == WORLD - 1
    assert "lock" in f.where and "train_ddp.py" in f.stack
    (a,) = hang_anomalies(verdict)
    assert "all_reduce" in a.summary and f"rank {HANG_RANK}" in a.summary
