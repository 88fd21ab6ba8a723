"""Stream worker throughput and detection latency on the real broker.

1. Throughput: a simulated job of 16,384 ranks (4,096 with --quick) is published as fast
   as the publisher can while one `argus worker` process consumes; records/s = rank-steps
   summarized per second from the first record published to the last summary. Measured
   at --ranks-per-message (64 by default: `argus simulate`'s node batch) and again at 8
   ranks per message (an 8-GPU node through the node relay: the live shape).
1b. Heartbeats: the same worker, a job of 16,384 ranks sending heartbeats as node batches
   (8 ranks per message, one HeartbeatBatch per node per period, as the relay sends),
   then one per message (no relay); heartbeats/s = heartbeats published per second from
   the first published to the worker's committed offset reaching the end of the topic.
1c. Rebalance (--workers 2): a job of 4,096 ranks live at 2 steps/s, 8 ranks per message;
   a second worker joins the group at 25 % of the run and leaves (SIGTERM) at 60 %:
   rebalance_lost = steps never summarized with all their ranks, rebalance_duplicated =
   summaries beyond one per step.
2. Latency: the same worker, a job published live at a fixed step rate with faults
   injected; for every anomaly, its Kafka timestamp minus the end of the step that
   confirmed it (both wall clocks of this machine).
3. Kernels (bench/streams_kernels.py, a worker of its own): a job of 4,096 ranks (1,024 with
   --quick) whose every rank publishes its kernel sketch and stack sample every step beside
   its step record; records_per_s_with_kernels and that worker's peak RSS.
Peak RSS of the worker process is sampled throughout.

    python bench/streams.py [--quick | --smoke]

    python bench/streams.py --workers 2   # + the rebalance phase

Last line: JSON with records_per_s, records_per_s_8, heartbeats_per_s (node batches of 8),
heartbeats_per_s_1 (one per message), latency_p50_s, latency_p99_s, worker_rss_mb,
records_per_s_with_kernels, worker_rss_mb_with_kernels (and rebalance_lost,
rebalance_duplicated with --workers 2).

``--smoke`` (CI: does it still run?): every phase at a tiny size (256 ranks, 12 steps, 3
heartbeat periods, a live job of 20 steps at up to 5 steps/s, the kernel phase at 128
ranks); the figures are not checked.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
from confluent_kafka import Consumer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from argus.config import load_settings  # noqa: E402
from argus.kafka_admin import GroupLag, ensure_topics, skip_worker_to_end  # noqa: E402
from argus.producers.publisher import Publisher  # noqa: E402
from argus.schemas import (  # noqa: E402
    ALL_TOPICS,
    ANOMALIES,
    HEARTBEATS,
    STEP_SUMMARIES,
    Heartbeat,
    HeartbeatBatch,
    decode,
    encode,
    job_key,
)
from argus.simulate import layout_for, parse_fault, publish_simulation  # noqa: E402
from argus.streams.intake import intake_group  # noqa: E402


class PeakRss(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return


WORKER_HOMES: list[Path] = []
"""The ARGUS_HOMEs of the workers started; kept while a run may fail (their logs are named
then), removed by :func:`remove_worker_homes` when it succeeded."""


def start_worker(app_id: str, loglevel: str = "warn") -> tuple[subprocess.Popen[bytes], Path]:
    """One `argus worker` in the consumer group ``app_id``, with its own ARGUS_HOME (and log)."""
    home = Path(tempfile.mkdtemp(prefix="argus-bench-"))
    WORKER_HOMES.append(home)
    worker = subprocess.Popen(
        [sys.executable, "-m", "argus.cli", "worker", "--app-id", app_id, "--loglevel", loglevel],
        env={**os.environ, "ARGUS_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=open(home / "worker.log", "w"),  # noqa: SIM115 - lives as long as the worker
    )
    return worker, home


def remove_worker_homes() -> None:
    """Remove the workers' ARGUS_HOMEs (a successful run: nobody needs their logs)."""
    while WORKER_HOMES:
        shutil.rmtree(WORKER_HOMES.pop(), ignore_errors=True)


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 30 s."""
    worker.terminate()
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()


def consume(
    conf: dict, job: str, want_steps: int, timeout: float
) -> tuple[list[float], list[tuple[float, int]]]:
    """Receive times of the job's summaries and (Kafka timestamp ms, detected_ns) of its anomalies."""
    c = Consumer({**conf, "group.id": f"bench-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"})
    c.subscribe([STEP_SUMMARIES, ANOMALIES])
    summaries: list[float] = []
    anomalies: list[tuple[float, int]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and len(summaries) < want_steps:
            for m in c.consume(1000, timeout=0.2):
                if m.error():
                    continue
                r = decode(m.value())
                if r.job != job:
                    continue
                if m.topic() == STEP_SUMMARIES:
                    summaries.append(time.time())
                else:
                    anomalies.append((m.timestamp()[1], r.detected_ns))
        # anomalies of the last steps close a little later
        end = time.monotonic() + 3
        while time.monotonic() < end:
            for m in c.consume(1000, timeout=0.2):
                if not m.error() and m.topic() == ANOMALIES:
                    r = decode(m.value())
                    if r.job == job:
                        anomalies.append((m.timestamp()[1], r.detected_ns))
    finally:
        c.close()
    return summaries, anomalies


def heartbeat_messages(job: str, ranks: int, periods: int, per_message: int) -> list[bytes]:
    """Encoded heartbeats of ``ranks`` ranks over ``periods`` periods of 5 s: node batches of
    ``per_message`` ranks (HeartbeatBatch), or one Heartbeat per message when 1."""
    t0 = time.time_ns() - periods * 5_000_000_000
    out = []
    for p in range(periods):
        beats = [
            Heartbeat(
                job,
                0,
                r,
                f"node{r // 8:05d}",
                t0 + p * 5_000_000_000 + r * 1000,
                p * 5,
                groups=(f"dp{r % 8}", f"tp{r // 8 % 64}", "world"),
                seq_entered=(p * 40 + 3, p * 80 + 1, p),
                seq_finished=(p * 40 + 3, p * 80, p),
                kinds=("all_reduce", "all_gather", "barrier"),
                nbytes=(1 << 26, 1 << 22, 0),
                stack="train.py:main;train.py:step;model.py:forward;torch/nn/modules/module.py:_call_impl",
            )
            for r in range(ranks)
        ]
        if per_message == 1:
            out += [encode(b) for b in beats]
        else:
            out += [
                encode(HeartbeatBatch.from_beats(beats[lo : lo + per_message]))
                for lo in range(0, ranks, per_message)
            ]
    return out


def heartbeat_throughput(
    publisher: Publisher, lag: GroupLag, job: str, ranks: int, periods: int, per_message: int, timeout: float
) -> float:
    """Heartbeats per second one worker takes: published as fast as possible, clock from the
    first published to the worker's committed offset at the end of the heartbeats topic."""
    messages = heartbeat_messages(job, ranks, periods, per_message)
    t0 = time.time()
    for value in messages:
        publisher.publish_raw(HEARTBEATS, job_key(job), value)
    publisher.drain(120)
    print(f"published {len(messages):,} heartbeat messages in {time.time() - t0:.1f} s", flush=True)
    deadline = time.monotonic() + timeout
    while lag().get(HEARTBEATS, 1) > 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"the worker did not take {len(messages)} heartbeat messages in {timeout} s")
        time.sleep(0.1)
    span = time.time() - t0
    rate = ranks * periods / span
    print(
        f"heartbeats: {ranks * periods:,} in {len(messages):,} messages ({per_message} per message) "
        f"taken in {span:.1f} s -> {rate:,.0f} heartbeats/s",
        flush=True,
    )
    return rate


def step_throughput(
    publisher: Publisher, conf: dict, job: str, ranks: int, steps: int, per_message: int, home: Path
) -> float:
    """Rank-steps per second one worker summarizes, ``per_message`` ranks per message. The
    messages are built and encoded first (the publisher's encoding is not what is measured)."""
    messages: list[tuple[str, bytes, bytes]] = []
    publish_simulation(
        lambda topic, key, record: messages.append((topic, key, encode(record))),
        job=job,
        layout=layout_for(ranks),
        steps=steps,
        seed=1,
        ranks_per_message=per_message,
    )
    t0 = time.time()
    for topic, key, value in messages:
        publisher.publish_raw(topic, key, value)
    publisher.drain(120)
    print(f"published {ranks * steps:,} rank-steps of {ranks} ranks in {time.time() - t0:.1f} s", flush=True)
    summaries, _ = consume(conf, job, steps, timeout=600)
    if len(summaries) < steps:
        raise SystemExit(f"worker summarized {len(summaries)} of {steps} steps; see {home / 'worker.log'}")
    span = summaries[-1] - t0
    rate = ranks * steps / max(span, 1e-9)
    print(
        f"throughput, {per_message} ranks per message: {steps} steps ({ranks * steps:,} rank-steps) in "
        f"{span:.1f} s from the first record published to the last summary -> {rate:,.0f} rank-steps/s",
        flush=True,
    )
    return rate


def rebalance(
    publisher: Publisher, conf: dict, app_id: str, ranks: int, steps: int, rate: float
) -> tuple[int, int, int]:
    """A job published live (8 ranks per message) while a second worker joins the group a
    quarter of the way in and leaves (SIGTERM) at 60 %; every step must be summarized
    exactly once, with all its ranks. Returns (steps lost or cut short, summaries beyond
    one per step, rebalances seen by the second worker's log: joined + left)."""
    job = f"bench-rebalance-{app_id}"
    got: dict[int, list[int]] = {}  # step -> ranks of each of its summaries
    done = threading.Event()

    def collect() -> None:
        c = Consumer({**conf, "group.id": f"bench-{uuid.uuid4().hex}", "auto.offset.reset": "latest"})
        c.subscribe([STEP_SUMMARIES])
        try:
            while not done.is_set():
                for m in c.consume(1000, timeout=0.2):
                    # other groups' workers on this broker summarize the job too: only this group's count
                    if m.error() or ("argus-group", app_id.encode()) not in (m.headers() or []):
                        continue
                    r = decode(m.value())
                    if r.job == job:
                        got.setdefault(r.step, []).append(r.ranks - len(r.missing))
        finally:
            c.close()

    collector = threading.Thread(target=collect)
    collector.start()
    time.sleep(3)  # the collector has joined before the first summary
    pub = threading.Thread(
        target=lambda: publish_simulation(
            publisher.publish,
            job=job,
            layout=layout_for(ranks),
            steps=steps,
            seed=3,
            rate=rate,
            ranks_per_message=8,
        )
    )
    t0 = time.monotonic()
    pub.start()
    time.sleep(0.25 * steps / rate)
    second, home = start_worker(app_id, loglevel="info")
    print(f"rebalance: a second worker joins at {time.monotonic() - t0:.1f} s", flush=True)
    time.sleep(max(0.0, 0.6 * steps / rate - (time.monotonic() - t0)))
    stop_worker(second)
    print(f"rebalance: the second worker left at {time.monotonic() - t0:.1f} s", flush=True)
    pub.join()
    publisher.flush(30)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and (len(got) < steps or any(max(v) < ranks for v in got.values())):
        time.sleep(0.5)
    time.sleep(5)  # a duplicate would come within the settle time
    done.set()
    collector.join()
    odd = {s: got.get(s, []) for s in range(steps) if got.get(s, [0]) != [ranks]}
    if odd:
        print(
            "rebalance: steps not summarized exactly once whole (step: ranks of each summary):",
            dict(list(odd.items())[:12]),
        )
    lost = sum(1 for s in range(steps) if max(got.get(s, [0])) < ranks)
    duplicated = sum(len(v) - 1 for v in got.values())
    print(
        f"rebalance: {steps} steps, {len(got)} summarized, {lost} lost or cut short, {duplicated} summaries "
        f"beyond one per step; second worker's log: {home / 'worker.log'}",
        flush=True,
    )
    return lost, duplicated, len(got)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--smoke", action="store_true", help="every phase at a tiny size: runs, figures unchecked"
    )
    ap.add_argument(
        "--ranks-per-message",
        type=int,
        default=64,
        help="rank-steps per Kafka message (64: a node batch as `argus simulate` sends; 1: a live rank agent)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=1,
        choices=(1, 2),
        help="2: also run the rebalance phase (a second worker joins mid-run and leaves again)",
    )
    args = ap.parse_args()
    per_message = args.ranks_per_message
    ranks = 256 if args.smoke else 4096 if args.quick else 16384
    steps = 12 if args.smoke else 40 if args.quick else 60
    live_steps = 20 if args.smoke else 40 if args.quick else 80
    max_rate = 5.0 if args.smoke else 2.0  # steps/s of the live job
    settings = load_settings()
    conf = settings.kafka_client_config()
    ensure_topics(conf, ALL_TOPICS, partitions=settings.kafka_partitions)
    layout = layout_for(ranks)
    publisher = Publisher(conf, block_when_full=True)
    run = uuid.uuid4().hex[:8]

    # 1. Throughput. The worker's groups start at the current end of their inputs, the internal
    # one included (it reads this run's jobs, not the broker's history). A short warm-up job first (the worker has
    # joined its group and learned nothing else); then the measured job is published as
    # fast as the publisher can, and the clock runs from its first record to its last
    # summary: the publishing overlaps, so this is what one worker sustains, not a burst.
    skip_worker_to_end(conf, f"bench-{run}")
    worker, home = start_worker(f"bench-{run}")
    rss = PeakRss(worker.pid)
    rss.start()
    try:
        warm = f"bench-warm-{run}"
        publish_simulation(publisher.publish, job=warm, layout=layout_for(64), steps=8, seed=9)
        publisher.flush(60)
        if len(consume(conf, warm, 8, timeout=120)[0]) < 8:
            raise SystemExit(f"the worker did not start; see {home / 'worker.log'}")
        records_per_s = step_throughput(publisher, conf, f"bench-tput-{run}", ranks, steps, per_message, home)
        records_per_s_8 = step_throughput(publisher, conf, f"bench-tput8-{run}", ranks, steps, 8, home)

        # 1b. Heartbeats: node batches of 8 (the relay's shape), then one per message.
        lag = GroupLag(conf, intake_group(f"bench-{run}", "heartbeats"), [HEARTBEATS])
        periods = 3 if args.smoke else 10 if args.quick else 30
        heartbeats_per_s = heartbeat_throughput(
            publisher, lag, f"bench-hb8-{run}", ranks, periods, 8, timeout=600
        )
        heartbeats_per_s_1 = heartbeat_throughput(
            publisher, lag, f"bench-hb1-{run}", ranks, 2, 1, timeout=600
        )

        # 1c. Rebalance: a second worker joins and leaves while a job is live.
        rebalance_figures = (
            rebalance(publisher, conf, f"bench-{run}", 4096, 60, 2.0) if args.workers == 2 else None
        )

        # 2. Latency: live job at a rate the worker keeps up with, faults injected.
        rate = min(max_rate, 0.5 * records_per_s / ranks)
        live = f"bench-live-{run}"
        faults = [
            parse_fault(f, layout)
            for start, f in (
                (10, f"compute_straggler@10+8:{ranks // 3}"),
                (20, f"dataloader_stall@20:{ranks // 5}"),
                (28, f"gc_pause@28:{ranks // 7}"),
                (33, f"compute_straggler@33+6:{ranks // 2}"),
            )
            if start < live_steps - 3
        ] + (
            [
                parse_fault(f"dataloader_stall@{s}:{(s * 97) % ranks}", layout)
                for s in range(45, live_steps - 3, 6)
            ]
        )
        pub = threading.Thread(
            target=lambda: publish_simulation(
                publisher.publish,
                job=live,
                layout=layout,
                steps=live_steps,
                faults=faults,
                seed=2,
                rate=rate,
                ranks_per_message=per_message,
            )
        )
        pub.start()
        _, anomalies = consume(conf, live, live_steps, timeout=live_steps / rate + 120)
        pub.join()
        publisher.flush(30)
    finally:
        stop_worker(worker)
        rss.stop.set()
    first = {}
    for ts_ms, detected_ns in anomalies:  # the first emission of each anomaly is its detection
        first.setdefault(detected_ns, ts_ms)
    lat = np.array([ts / 1e3 - ns / 1e9 for ns, ts in first.items()])
    p50, p99 = (float(np.percentile(lat, q)) for q in (50, 99)) if len(lat) else (float("nan"),) * 2
    rss_mb = rss.peak / 2**20

    # 3. Kernel sketches and stacks flowing (a worker of its own).
    kernels_bench = runpy.run_path(str(REPO / "bench" / "streams_kernels.py"))
    kernel_ranks = kernels_bench["SMOKE_RANKS"] if args.smoke else 1024 if args.quick else 4096
    kernels = kernels_bench["throughput_with_kernels"](conf, kernel_ranks, 16 if args.smoke else 24)
    print()
    print(
        f"{'ranks':>8} {'records/s':>12} {'records/s @8':>13} {'beats/s @8':>11} {'beats/s @1':>11} "
        f"{'anomalies':>10} {'latency p50 s':>14} {'p99 s':>8} {'worker RSS MB':>14}"
    )
    print(
        f"{ranks:>8} {records_per_s:>12,.0f} {records_per_s_8:>13,.0f} {heartbeats_per_s:>11,.0f} "
        f"{heartbeats_per_s_1:>11,.0f} {len(lat):>10} {p50:>14.3f} {p99:>8.3f} {rss_mb:>14.0f}"
    )
    print(
        json.dumps(
            {
                "records_per_s": round(records_per_s),
                "records_per_s_8": round(records_per_s_8),
                "heartbeats_per_s": round(heartbeats_per_s),
                "heartbeats_per_s_1": round(heartbeats_per_s_1),
                **(
                    {"rebalance_lost": rebalance_figures[0], "rebalance_duplicated": rebalance_figures[1]}
                    if rebalance_figures
                    else {}
                ),
                "latency_p50_s": round(p50, 3),
                "latency_p99_s": round(p99, 3),
                "worker_rss_mb": round(rss_mb, 1),
                "records_per_s_with_kernels": kernels["records_per_s_with_kernels"],
                "worker_rss_mb_with_kernels": kernels["worker_rss_mb_with_kernels"],
                "ranks_with_kernels": kernels["ranks"],
                "ranks": ranks,
                "ranks_per_message": per_message,
                "step_rate_live": round(rate, 3),
                "anomalies": len(lat),
            }
        )
    )
    remove_worker_homes()


if __name__ == "__main__":
    main()
