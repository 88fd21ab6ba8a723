"""The node relay: what it costs on a node, and what it saves the stream workers.

1. Relay cost (no broker): 8 rank clients send one-rank StepBatches over the real Unix
   socket to a :class:`~producers.relay.NodeRelay` in this process, which merges them;
   CPU time of this process (both sides) per rank record.
2. Worker catch-up (real broker, skipped if none): the same job of 4,096 ranks published
   as one rank per message (what rank agents send without a relay) and as 8 ranks per
   message (what the relay of an 8-GPU node sends); each time a fresh `argus worker`
   catches up the backlog; rank-steps/s between its first and last step summary.
3. Heartbeats (real broker): the relay does not merge them, so they reach the workers one
   rank per message (every ``heartbeat_s``, 5 s by default); a fresh worker drains a backlog
   of them; heartbeats/s from its committed offsets (committed every few seconds).

    python bench/relay.py [--quick | --smoke]

Last line: JSON with relay_us_per_record and, with a broker, worker_rank_steps_per_s_1,
worker_rank_steps_per_s_8, speedup and worker_heartbeats_per_s.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from argus.config import load_settings  # noqa: E402
from argus.kafka_admin import KafkaUnavailable, ensure_topics, probe_kafka, skip_worker_to_end  # noqa: E402
from argus.producers.publisher import Publisher  # noqa: E402
from argus.producers.relay import NodeRelay, RelayClient  # noqa: E402
from argus.schemas import ALL_TOPICS, HEARTBEATS, Record, StepBatch, StepRecord, encode  # noqa: E402
from argus.simulate import layout_for, publish_simulation  # noqa: E402
from argus.streams.intake import intake_group  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_streams", REPO / "bench" / "streams.py")
assert _spec is not None and _spec.loader is not None
bench_streams = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_streams)


class Counting:
    """The relay's sink: counts merged batches and rows."""

    def __init__(self) -> None:
        self.batches = 0
        self.rows = 0

    def publish(self, topic: str, key: bytes, record: Record) -> None:
        assert isinstance(record, StepBatch)
        self.batches += 1
        self.rows += len(record)

    def publish_raw(self, topic: str, key: bytes, value: bytes) -> None:
        raise AssertionError("every part decodes")


def relay_cost(steps: int, ranks: int = 8) -> dict[str, float]:
    t0 = time.time_ns()
    parts = [
        [
            encode(
                StepBatch.from_records(
                    [StepRecord("bench", 0, s, r, start_ns=t0 + s * 10**9, end_ns=t0 + s * 10**9 + 9 * 10**8)]
                )
            )
            for r in range(ranks)
        ]
        for s in range(steps)
    ]
    sink = Counting()
    with tempfile.TemporaryDirectory() as tmp:
        relay = NodeRelay(Path(tmp) / "relay.sock", sink)
        stop = threading.Event()
        server = threading.Thread(target=relay.serve, args=(stop,))
        server.start()
        clients = [RelayClient(relay.path) for _ in range(ranks)]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for step in parts:
            for client, raw in zip(clients, step, strict=True):
                while not client.send(raw):  # the socket's queue is full: this bench waits
                    client._retry_at = 0.0
                    time.sleep(0.001)
        while sink.rows < steps * ranks:
            time.sleep(0.001)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        stop.set()
        server.join()
    records = steps * ranks
    print(
        f"relay: {records:,} rank records in {sink.batches:,} messages; {wall:.2f} s wall, "
        f"{cpu:.2f} s CPU (ranks and relay) = {cpu / records * 1e6:.1f} µs per record",
        flush=True,
    )
    return {"relay_us_per_record": round(cpu / records * 1e6, 2), "relay_messages": sink.batches}


def catch_up(conf: dict[str, Any], per_message: int, ranks: int, steps: int) -> float:
    """Rank-steps/s of a fresh worker catching up a job published ahead."""
    run = uuid.uuid4().hex[:8]
    app = f"bench-relay-{run}"
    skip_worker_to_end(conf, app)
    publisher = Publisher(conf, block_when_full=True)
    job = f"bench-relay-{per_message}-{run}"
    publish_simulation(
        publisher.publish,
        job=job,
        layout=layout_for(ranks),
        steps=steps,
        seed=1,
        ranks_per_message=per_message,
    )
    publisher.drain(300)
    publisher.shutdown()
    worker, home = bench_streams.start_worker(app)
    try:
        summaries, _ = bench_streams.consume(conf, job, steps, timeout=900)
        cpu = psutil.Process(worker.pid).cpu_times()
    finally:
        bench_streams.stop_worker(worker)
    if len(summaries) < steps:
        raise SystemExit(
            f"the worker summarized {len(summaries)} of {steps} steps; see {home / 'worker.log'}"
        )
    span = float(summaries[-1] - summaries[0])
    rate = ranks * (steps - 1) / span
    print(
        f"worker, {per_message} rank(s) per message: {steps - 1} steps of {ranks:,} ranks in {span:.1f} s "
        f"-> {rate:,.0f} rank-steps/s ({rate / per_message:,.0f} messages/s; worker CPU {cpu.user + cpu.system:.1f} s "
        "in all, start-up included)",
        flush=True,
    )
    return rate


def heartbeat_drain(conf: dict[str, Any], ranks: int, rounds: int) -> float:
    """Heartbeats/s of a fresh worker draining a backlog of per-rank heartbeats."""
    from confluent_kafka import Consumer, TopicPartition

    from argus.producers.simulator import ClusterSimulator
    from argus.schemas import job_key

    run = uuid.uuid4().hex[:8]
    app = job = f"bench-heartbeats-{run}"
    skip_worker_to_end(conf, app)
    publisher = Publisher(conf, block_when_full=True)
    sim = ClusterSimulator(layout_for(ranks), seed=1, job=job, start_ns=time.time_ns())
    for step in sim.run(rounds):
        for beat in step.heartbeats():
            publisher.publish(HEARTBEATS, job_key(job), beat)
    publisher.drain(300)
    publisher.shutdown()
    offsets = Consumer({**conf, "group.id": intake_group(app, "heartbeats")})  # the heartbeat intake's
    parts = offsets.list_topics(HEARTBEATS, timeout=10).topics[HEARTBEATS].partitions
    tps = [TopicPartition(HEARTBEATS, p) for p in parts]
    ends = {tp.partition: offsets.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}

    def lag() -> int:
        return sum(ends[tp.partition] - max(tp.offset, 0) for tp in offsets.committed(tps, timeout=10))

    backlog = lag()
    worker, home = bench_streams.start_worker(app)
    started = time.monotonic()
    first: tuple[float, int] | None = None
    try:
        deadline = time.monotonic() + 900
        while (left := lag()) and time.monotonic() < deadline:
            if first is None and left < backlog:
                first = (time.monotonic(), left)
            time.sleep(0.5)
        done = time.monotonic()
    finally:
        bench_streams.stop_worker(worker)
        offsets.close()
    if left:
        raise SystemExit(f"the worker left {left:,} of {backlog:,} heartbeats; see {home / 'worker.log'}")
    note = ""
    if first is None:  # the whole backlog was committed at once: timed from the worker's start
        first, note = (
            (started, backlog),
            " (drained in one commit: timed from the worker's start, start-up included)",
        )
    rate = first[1] / (done - first[0])
    print(
        f"worker, heartbeats (one rank per message): {first[1]:,} in {done - first[0]:.1f} s "
        f"-> {rate:,.0f}/s, i.e. {rate * 5:,.0f} ranks at one heartbeat per 5 s{note}",
        flush=True,
    )
    return rate


def main() -> None:
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true")
    g.add_argument("--smoke", action="store_true", help="tiny sizes: the bench runs (CI); figures unchecked")
    args = ap.parse_args()
    out: dict[str, float] = relay_cost(steps=50 if args.smoke else 500 if args.quick else 5000)
    settings = load_settings()
    conf = settings.kafka_client_config()
    try:
        probe_kafka(conf)
    except KafkaUnavailable as exc:
        print(f"worker catch-up skipped: {exc}")
    else:
        ensure_topics(conf, ALL_TOPICS, partitions=settings.kafka_partitions)
        ranks, steps = (64, 5) if args.smoke else (1024, 20) if args.quick else (4096, 40)
        one = catch_up(conf, 1, ranks, steps)
        eight = catch_up(conf, 8, ranks, steps)
        out |= {
            "worker_rank_steps_per_s_1": round(one),
            "worker_rank_steps_per_s_8": round(eight),
            "speedup": round(eight / one, 2),
            "worker_heartbeats_per_s": round(
                heartbeat_drain(conf, ranks, 3 if args.smoke else 10 if args.quick else 30)
            ),
        }
    print(json.dumps(out))
    bench_streams.remove_worker_homes()


if __name__ == "__main__":
    main()
