"""Sink insert rate and dashboard latency on embedded ClickHouse (chDB).

1. Insert: step records of a synthetic job are published to a fresh topic on the real
   broker as StepBatches of 64 ranks (a node agent's batch, as `argus simulate` sends
   them); then the exactly-once sink (`sinks.kafka_sink.KafkaSink`, default batching:
   5,000 rows or 1 s per insert) consumes them into a fresh chDB directory.
   rows/s = rows / (first message consumed → last insert committed); decode, Arrow,
   insert (with the materialized views) and both offset commits are inside the clock.
2. Panels: a job of 10M step rows (1M with --quick; 16,384 ranks, 4,096 with --quick),
   written straight into the same store as Arrow, plus kernels, stacks, GPU samples,
   step summaries and anomalies of a straggler; then every dashboard panel's SQL
   (`sinks.grafana.all_panels()`, macros expanded for the whole job, rank = the
   straggler), each alert rule and each `argus report` query, three runs each.

    python bench/sink.py [--quick | --smoke]

Last line: JSON with insert_rows_per_s, panel_ms_max (slowest dashboard panel, worst of
its three runs) and rows (step rows of the job the panels ran on).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from argus.config import load_settings  # noqa: E402
from argus.kafka_admin import ensure_topics, probe_kafka  # noqa: E402
from argus.schemas import (  # noqa: E402
    STEPS,
    Anomaly,
    GpuSample,
    StackSample,
    StepBatch,
    StepSummary,
    encode,
    step_key,
)
from argus.sinks import ChdbStore, migrate, to_arrow  # noqa: E402
from argus.sinks.grafana import ALERTS, all_panels, expand  # noqa: E402
from argus.sinks.grafana.queries import REPORT  # noqa: E402
from argus.sinks.kafka_sink import KafkaSink  # noqa: E402
from argus.sinks.report import build_report  # noqa: E402

PERIOD_NS = 1_000_000_000  # one step per second
RANKS_PER_MESSAGE = 64
STRAGGLER = 1234


class Borrowed:
    """The bench's store lent to the sink: the sink may close it, the bench keeps it open."""

    def __init__(self, store: ChdbStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def close(self) -> None:
        pass


class Job:
    """A synthetic synchronous job: every rank waits in all-reduce for the slowest one."""

    def __init__(
        self, name: str, ranks: int, t0_ns: int, *, straggler: int = STRAGGLER, seed: int = 7
    ) -> None:
        self.name, self.ranks, self.t0_ns, self.straggler = name, ranks, t0_ns, straggler % ranks
        self.rng = np.random.default_rng(seed)
        r = np.arange(ranks)
        self.rank = r
        self.host = np.array([f"node-{h:05d}" for h in range(ranks // 8 + 1)], dtype=object)[r // 8]
        self.uuid = np.array([f"GPU-{name[-6:]}-{i:06d}" for i in r], dtype=object)
        self.tp, self.pp, self.dp = r % 8, (r // 8) % 4, r // 32

    def batch(self, step: int) -> StepBatch:
        """Every rank's record of one step."""
        n = self.ranks
        cols = StepBatch.empty_columns(n)
        fwd = self.rng.normal(120.0, 3.0, n)
        bwd = self.rng.normal(240.0, 6.0, n)
        if step >= 20:
            fwd[self.straggler] *= 1.3
            bwd[self.straggler] *= 1.3
        opt = self.rng.normal(8.0, 0.3, n)
        dl = self.rng.exponential(1.5, n)
        busy = fwd + bwd + opt + dl + 1.0
        wall = float(busy.max()) + 5.0
        start = self.t0_ns + step * PERIOD_NS
        cols.update(
            rank=self.rank,
            host=self.host,
            gpu_uuid=self.uuid,
            dp=self.dp,
            tp=self.tp,
            pp=self.pp,
            start_ns=np.full(n, start, np.int64),
            end_ns=np.full(n, start + int(wall * 1e6), np.int64),
            forward_ms=fwd,
            backward_ms=bwd,
            optimizer_ms=opt,
            dataloader_ms=dl,
            h2d_ms=np.full(n, 1.0),
            all_reduce_ms=wall - busy,
            samples=np.full(n, 32, np.int64),
            tokens=np.full(n, 65536, np.int64),
        )
        return StepBatch(self.name, 0, step, cols)


# -- 1. insert rate through the sink -----------------------------------------------------------
def publish(conf: dict[str, Any], topic: str, job: Job, steps: int) -> int:
    producer = Producer({**conf, "linger.ms": 20, "batch.size": 1 << 20, "compression.type": "lz4"})
    messages = 0
    for step in range(steps):
        batch = job.batch(step)
        key = step_key(job.name, step)
        for lo in range(0, len(batch), RANKS_PER_MESSAGE):
            value = encode(batch.take(np.arange(lo, min(lo + RANKS_PER_MESSAGE, len(batch)))))
            while True:
                try:
                    producer.produce(topic, key=key, value=value)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
            messages += 1
    if producer.flush(60) != 0:
        raise SystemExit("the broker did not take every message")
    return messages


def insert_rate(store: ChdbStore, conf: dict[str, Any], rows: int) -> dict[str, float]:
    tag = uuid.uuid4().hex[:8]
    topic = f"bench-sink-{tag}"
    ensure_topics(conf, [topic], partitions=2)
    ranks = 4096
    steps = rows // ranks
    job = Job(f"bench-insert-{tag}", ranks, time.time_ns() - steps * PERIOD_NS)
    t = time.perf_counter()
    messages = publish(conf, topic, job, steps)
    published_s = time.perf_counter() - t
    sink = KafkaSink(lambda: Borrowed(store), conf, topics={topic: STEPS}, group=f"bench-sink-{tag}")
    first: float | None = None
    deadline = time.monotonic() + 600
    try:
        while sink.stats.messages < messages and time.monotonic() < deadline:
            if sink.poll(0.2) and first is None:
                first = time.perf_counter()
        sink.flush_all()
        took = time.perf_counter() - (first or time.perf_counter())
    finally:
        sink.close()
        AdminClient(conf).delete_topics([topic])
    stored = store.query_rows("SELECT count() FROM steps WHERE job = {j:String}", {"j": job.name})[0][0]
    if stored != steps * ranks:
        raise SystemExit(f"the sink stored {stored} rows, expected {steps * ranks}")
    return {
        "rows": steps * ranks,
        "messages": messages,
        "publish_s": published_s,
        "sink_s": took,
        "inserts": sink.stats.inserts,
        "rows_per_s": steps * ranks / took,
    }


# -- 2. panels at scale ------------------------------------------------------------------------
def load_big_job(store: ChdbStore, job: Job, steps: int) -> float:
    """Steps straight into the store as Arrow, plus the side tables the panels read."""
    t = time.perf_counter()
    chunk = max(1, 1_000_000 // job.ranks)
    for lo in range(0, steps, chunk):
        table, data = to_arrow([job.batch(s) for s in range(lo, min(lo + chunk, steps))])
        store.insert_arrow(table, data)
    end_ns = job.t0_ns + steps * PERIOD_NS
    watched = np.unique(np.r_[job.straggler, np.arange(0, job.ranks, job.ranks // 127)])[:128]
    summaries = [
        StepSummary(
            job.name,
            0,
            s,
            job.t0_ns + s * PERIOD_NS + 500_000_000,
            job.ranks,
            (),
            380.0,
            390.0,
            500.0,
            370.0,
            12.0,
            1.5,
            0.0,
            65536 * job.ranks,
            (job.straggler,) if s >= 20 else (),
        )
        for s in range(steps)
    ]
    stacks = [
        StackSample(
            job.name,
            0,
            int(r),
            s,
            job.t0_ns + s * PERIOD_NS,
            job.t0_ns + (s + 1) * PERIOD_NS,
            tuple(
                f"train.py:main;train.py:step;model.py:layer{k};torch/nn/functional.py:f{k % 3}"
                for k in range(10)
            ),
            tuple(int(c) for c in job.rng.integers(1, 50, 10)),
        )
        for r in watched
        for s in range(0, steps, 5)
    ]
    gpus = [
        GpuSample(
            str(job.host[g]),
            str(job.uuid[g]),
            g % 8,
            t_ns,
            gpu_util=97.0,
            sm_clock_mhz=1410.0,
            power_w=390.0,
            temp_c=70.0,
        )
        for g in range(job.ranks)
        for t_ns in range(job.t0_ns, end_ns, 30 * PERIOD_NS)
    ]
    anomaly = Anomaly(
        f"bench-{job.name}",
        job.name,
        0,
        20,
        steps - 1,
        "cross_rank",
        "rank",
        f"rank:{job.straggler}",
        (job.straggler,),
        "compute_straggler",
        30.0,
        {"compute_ms_z": 30.0},
        "bench straggler",
        110.0,
        1.5,
        end_ns,
    )
    for records in (summaries, stacks, gpus, [anomaly]):
        table, data = to_arrow(records)
        store.insert_arrow(table, data)
    k = 16
    n = len(watched) * steps * k
    ranks_col = np.repeat(watched, steps * k)
    step_col = np.tile(np.repeat(np.arange(steps), k), len(watched))
    kid = np.tile(np.arange(k), len(watched) * steps)
    p50 = 50.0 * (kid + 1) * np.where(ranks_col == job.straggler, 1.3, 1.0) * job.rng.normal(1.0, 0.02, n)
    kernels = pa.table(
        {
            "job": pa.array([job.name] * n, pa.string()),
            "run": pa.array(np.zeros(n), pa.uint32()),
            "rank": pa.array(ranks_col, pa.uint32()),
            "step": pa.array(step_col, pa.uint64()),
            "time": pa.array((job.t0_ns + step_col * PERIOD_NS) // 1_000_000, pa.timestamp("ms")),
            "kernel_id": pa.array(kid, pa.uint32()),
            "name": pa.array(np.array([f"kernel_{i:02d}" for i in range(k)], dtype=object)[kid], pa.string()),
            "count": pa.array(np.full(n, 24), pa.uint32()),
            "total_ns": pa.array((p50 * 24 * 1000).astype(np.uint64), pa.uint64()),
            "p50_ns": pa.array(p50 * 1000, pa.float32()),
            "p90_ns": pa.array(p50 * 1300, pa.float32()),
            "p99_ns": pa.array(p50 * 1600, pa.float32()),
            "max_ns": pa.array((p50 * 2000).astype(np.uint64), pa.uint64()),
        }
    )
    store.insert_arrow("kernels", kernels)
    return time.perf_counter() - t


def time_queries(
    store: ChdbStore,
    queries: list[tuple[str, str]],
    variables: dict[str, str],
    start: datetime,
    end: datetime,
    interval_s: int,
) -> list[tuple[str, list[float], int]]:
    out = []
    for name, sql in queries:
        expanded = expand(sql, start=start, end=end, interval_s=interval_s, variables=variables)
        runs, rows = [], 0
        for _ in range(3):
            t = time.perf_counter()
            rows = store.query_arrow(expanded).num_rows
            runs.append((time.perf_counter() - t) * 1000)
        out.append((name, runs, rows))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="1M step rows for the panels, fewer inserted")
    g.add_argument("--smoke", action="store_true", help="tiny sizes: the bench runs (CI); figures unchecked")
    args = parser.parse_args()
    rows_big = 50_000 if args.smoke else 1_000_000 if args.quick else 10_000_000
    ranks_big = 256 if args.smoke else 4096 if args.quick else 16384
    rows_insert = 20_000 if args.smoke else 500_000 if args.quick else 2_000_000

    settings = load_settings()
    conf = {"bootstrap.servers": settings.kafka_bootstrap}
    probe_kafka(conf, timeout=10)
    with tempfile.TemporaryDirectory(prefix="argus-bench-sink-") as tmp:
        store = ChdbStore(tmp)
        try:
            migrate(store)
            ins = insert_rate(store, conf, rows_insert)
            print(
                f"insert through the sink: {ins['rows']:,} rows in {ins['messages']:,} messages of "
                f"{RANKS_PER_MESSAGE} ranks, {ins['inserts']:,} inserts, {ins['sink_s']:.2f} s "
                f"→ {ins['rows_per_s']:,.0f} rows/s (publishing took {ins['publish_s']:.1f} s, not timed)"
            )

            steps = rows_big // ranks_big
            now = datetime.now(UTC).replace(microsecond=0)
            job = Job(
                f"bench-panels-{uuid.uuid4().hex[:8]}", ranks_big, int((now.timestamp() - steps - 60) * 1e9)
            )
            load_s = load_big_job(store, job, steps)
            rows = store.query_rows("SELECT count() FROM steps WHERE job = {j:String}", {"j": job.name})[0][0]
            print(
                f"panel job: {rows:,} step rows ({ranks_big:,} ranks × {steps} steps) loaded in {load_s:.1f} s"
            )

            start = datetime.fromtimestamp(job.t0_ns / 1e9, UTC) - timedelta(minutes=1)
            end = now + timedelta(minutes=1)
            interval = max(1, int((end - start).total_seconds()) // 600)
            # every dashboard variable: the job, the straggler, its slowest kernel
            variables = {"job": job.name, "rank": str(job.straggler), "kernel": "kernel_15"}
            panels = time_queries(
                store, [(f"{d.uid}/{p.key}", p.sql) for d, p in all_panels()], variables, start, end, interval
            )
            others = time_queries(
                store,
                [(f"alert/{a.uid}", a.sql) for a in ALERTS] + [(f"report/{p.key}", p.sql) for p in REPORT],
                variables,
                start,
                end,
                interval,
            )
            t = time.perf_counter()
            html = build_report(store, job.name, now=now)
            report_s = time.perf_counter() - t
        finally:
            store.close()

    print(f"\n{'query':<40} {'rows':>7} {'first ms':>9} {'median ms':>10} {'max ms':>8}")
    for name, runs, n in panels + others:
        flag = "" if max(runs) < 1000 else "  > 1 s"
        print(f"{name:<40} {n:>7,} {runs[0]:>9.1f} {statistics.median(runs):>10.1f} {max(runs):>8.1f}{flag}")
    print(f"\nargus report on the {rows:,}-row job: {report_s:.2f} s, {len(html) // 1024} KiB of HTML")
    panel_ms_max = max(max(runs) for _, runs, _ in panels)
    print(
        f"goals: insert ≥ 200,000 rows/s: {ins['rows_per_s']:,.0f}; every panel < 1 s: {panel_ms_max:.0f} ms max"
    )
    print(
        json.dumps(
            {
                "insert_rows_per_s": round(ins["rows_per_s"]),
                "panel_ms_max": round(panel_ms_max, 1),
                "rows": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
