"""Stream worker throughput with kernel sketches and stack samples flowing, on the real broker.

A simulated job of 4,096 ranks (1,024 with --quick) in which every rank publishes, every
step, its step record (64 ranks per message, as ``argus simulate`` batches them), its
kernel sketch (delta-coded, names once) and its stack sample, keyed by rank as the agent
does. The messages are built and encoded first; then they are published as fast as the
publisher can while one `argus worker` consumes. records_per_s_with_kernels = every
record published (rank-steps, sketches, names, stacks) per second, from the first one
published to the moment the worker has summarized every step and named the kernel of the
job's one fault (a GPU whose GEMMs run 1.3x slower from a quarter of the run on): the
``level=kernel`` anomaly needs the sketches of the fault's steps, so by then the worker
has taken in (nearly) everything. The worker's peak RSS is sampled
throughout, and the history's bound per rank (``HistoryConfig.bytes_per_rank``) printed
beside it. (bench/streams.py measures the step-record floor without kernels.)

    python bench/streams_kernels.py [--quick | --smoke]

``--smoke`` (CI: does it still run?): 128 ranks, 16 steps; the figures are not checked, but
the worker must still summarize every step and name the kernel.

Last line: JSON with records_per_s_with_kernels, rank_steps_per_s_with_kernels,
worker_rss_mb_with_kernels, ranks, history_bytes_per_rank_max.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from argus.config import load_settings  # noqa: E402
from argus.kafka_admin import end_offsets, ensure_topics, read_records, skip_worker_to_end  # noqa: E402
from argus.producers.publisher import Publisher  # noqa: E402
from argus.schemas import ALL_TOPICS, ANOMALIES, KERNELS, STACKS, STEP_SUMMARIES, STEPS, encode  # noqa: E402
from argus.simulate import layout_for, parse_fault, publish_simulation  # noqa: E402
from argus.streams.deepening import EVIDENCE_TOPIC, HistoryConfig  # noqa: E402

SMOKE_RANKS = 128
"""``--smoke``'s job (and bench/streams.py's kernel phase under ``--smoke``)."""


def _streams_bench() -> object:
    """bench/streams.py's worker harness (start/stop, peak RSS, summaries consumer)."""
    spec = importlib.util.spec_from_file_location("bench_streams", REPO / "bench" / "streams.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def throughput_with_kernels(conf: dict, ranks: int, steps: int) -> dict[str, float]:
    """One worker, a job of ``ranks`` ranks publishing steps, kernel sketches and stacks."""
    sb = _streams_bench()
    job = f"bench-k-{uuid.uuid4().hex[:8]}"
    app_id = f"bench-k-{uuid.uuid4().hex[:8]}"
    ensure_topics(conf, ALL_TOPICS, partitions=16)
    ensure_topics(conf, [EVIDENCE_TOPIC], partitions=16)
    skip_worker_to_end(conf, app_id)
    messages: list[tuple[str, bytes, bytes]] = []
    t_build = time.time()
    layout = layout_for(ranks)
    fault = parse_fault(f"compute_straggler@{steps // 4}+{steps}:{ranks // 3},kernel=gemm,x=1.3", layout)
    publish_simulation(
        lambda topic, key, record: messages.append((topic, key, encode(record))),
        job=job,
        layout=layout,
        steps=steps,
        faults=[fault],
        seed=1,
        checkpoint_every=0,
        kernels=True,
    )
    kinds = {t: sum(m[0] == t for m in messages) for t in (STEPS, KERNELS, STACKS)}
    print(f"built {len(messages):,} messages {kinds} in {time.time() - t_build:.1f} s", flush=True)
    records = ranks * steps + kinds[KERNELS] + kinds[STACKS]
    worker, home = sb.start_worker(app_id)  # type: ignore[attr-defined]
    rss = sb.PeakRss(worker.pid)  # type: ignore[attr-defined]
    rss.start()
    try:
        time.sleep(8)  # the worker joins its group
        since = end_offsets(conf, [ANOMALIES, STEP_SUMMARIES])
        publisher = Publisher(conf, block_when_full=True)
        t0 = time.time()
        for topic, key, value in messages:
            publisher.publish_raw(topic, key, value)
        publisher.drain(300)
        publisher.shutdown()
        print(f"published {records:,} records in {time.time() - t0:.1f} s", flush=True)
        summaries, done = follow(conf, job, steps, since, timeout=240)
        if len(summaries) < steps or done is None:
            raise SystemExit(
                f"{len(summaries)}/{steps} steps, kernel anomaly {done}; see {home / 'worker.log'}"
            )
    finally:
        rss.stop.set()
        sb.stop_worker(worker)  # type: ignore[attr-defined]
    span = max(max(done, summaries[-1]) - t0, 1e-9)
    steps_span = max(summaries[-1] - t0, 1e-9)
    out = {
        "records_per_s_with_kernels": round(records / span),
        "rank_steps_per_s_with_kernels": round(ranks * steps / steps_span),
        "worker_rss_mb_with_kernels": round(rss.peak / 2**20, 1),
        "ranks": ranks,
        "history_bytes_per_rank_max": HistoryConfig().bytes_per_rank(),
    }
    print(
        f"{ranks:,} ranks x {steps} steps: {records:,} records (steps, kernel sketches, stacks) taken in "
        f"{span:.1f} s -> {out['records_per_s_with_kernels']:,} records/s; every step summarized after "
        f"{steps_span:.1f} s -> {out['rank_steps_per_s_with_kernels']:,} rank-steps/s; worker peak RSS "
        f"{out['worker_rss_mb_with_kernels']} MB (history bound {out['history_bytes_per_rank_max']:,} B/rank)",
        flush=True,
    )
    return out


def follow(conf: dict, job: str, steps: int, since: dict, timeout: float) -> tuple[list[float], float | None]:
    """Receive times of the job's step summaries, and when its first ``level=kernel``
    anomaly naming ``gemm`` came (read from the offsets ``since``, not the topics' history)."""
    summaries: list[float] = []
    found: list[float] = []

    def take(topic: str, r: Any) -> None:
        if r.job != job:
            return
        if topic == STEP_SUMMARIES:
            summaries.append(time.time())
        elif not found and r.level == "kernel" and "kernel_family:gemm" in r.evidence:
            found.append(time.time())

    read_records(conf, since, take, until=lambda: len(summaries) >= steps and bool(found), timeout=timeout)
    return summaries, (found[0] if found else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,024 ranks (< 2 minutes)")
    ap.add_argument("--smoke", action="store_true", help="128 ranks, 16 steps: runs, figures unchecked")
    ap.add_argument("--steps", type=int, default=0, help="steps (default 16 quick or smoke, 24)")
    args = ap.parse_args()
    conf = load_settings().kafka_client_config()
    ranks = SMOKE_RANKS if args.smoke else 1024 if args.quick else 4096
    out = throughput_with_kernels(conf, ranks, args.steps or (16 if args.quick or args.smoke else 24))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
