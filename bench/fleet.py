"""The fleet view on a simulated month, and its queries at a 10,000-host scale.

1. **The month**: a fleet (:class:`FleetSimulator`: hundreds of nodes, thousands of small jobs
   placed at random over weeks, a few truly bad nodes of four kinds appearing at random
   times, background faults that make healthy nodes unlucky once). Every job's steps go
   through the real diagnosis engine (``JobDiagnoser``, as bench/diagnosis.py drives it);
   its steps, its anomalies and the node agents' NVML samples are stored in chDB as the sink
   stores them (``to_arrow`` -> ``insert_arrow``, the materialized views fill the rollups).
   Then, every 12 simulated hours, ``argus fleet``'s view over the last 7 days
   (``argus.fleet.fleet_view``) names its suspects. ``bad_node_recall``: bad nodes named at
   some check after their onset; ``false_suspect_nodes``: other nodes ever named (a bad
   node named before its onset counts too); ``jobs_to_detection``: per bad node named, the
   jobs it had slowed (the fault showed in them) before the check that named it.
2. **The scale**: a fresh chDB store with 1,000,000 anomalies (a fifth of them stored twice,
   as growing windows are) on 10,000 hosts over 30 days, their placements, 7.2 M host-hours,
   2.4 M GPU-days of health and 6.4 M rank-jobs' compute (``rank_work_days``, what the test
   of GPUs slower than their job peers reads). The rollups are filled directly (the month above fills them
   through the views; ``node_days`` follows ``node_hours`` through its view); the anomalies
   go through their views (the join that places them in
   ``anomaly_nodes``, and from there ``node_jobs``, the ranking's rollup); then every table is
   merged (``OPTIMIZE ... FINAL``), as a live store's background merges keep it, not as a
   bulk fill leaves it.
   Timed, 4 runs each after one warm-up: the fleet view over the last 7 days and over all
   30 (each with its query of GPUs slower than their job peers), and the evidence of 20 hosts. ``fleet_query_ms_max``: the slowest single query any
   of them ran (the store is wrapped to time each); ``fleet_view_7d_ms_p50``: the whole
   7-day view, every query together.

Prints a table, then one JSON line. ``--quick``: a smaller fleet over two weeks;
``--smoke``: a few jobs and 20,000 anomalies (checks that it runs, figures not meaningful).

    .venv/bin/python bench/fleet.py [--quick | --smoke] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from argus.detectors import JobDiagnoser
from argus.producers.simulator import KERNEL_NAMES, FleetSimulator
from argus.schemas import Anomaly

MODES = {
    "full": {
        "nodes": 250,
        "jobs": 1500,
        "days": 30.0,
        "bad_nodes": 12,
        "anomalies": 1_000_000,
        "hosts": 10_000,
    },
    "quick": {
        "nodes": 100,
        "jobs": 450,
        "days": 14.0,
        "bad_nodes": 8,
        "anomalies": 1_000_000,
        "hosts": 10_000,
    },
    "smoke": {"nodes": 32, "jobs": 40, "days": 3.0, "bad_nodes": 2, "anomalies": 20_000, "hosts": 500},
}
CHECK_EVERY = timedelta(hours=12)
WINDOW = timedelta(days=7)

_FLEET: FleetSimulator | None = None


def _init(params: dict[str, float]) -> None:
    global _FLEET
    _FLEET = _fleet(params)


def _fleet(params: dict[str, float]) -> FleetSimulator:
    return FleetSimulator(
        nodes=int(params["nodes"]),
        jobs=int(params["jobs"]),
        days=float(params["days"]),
        bad_nodes=int(params["bad_nodes"]),
        seed=int(params.get("seed", 7)),
    )


def diagnose_job(index: int) -> tuple[int, pa.Table, list[Anomaly], float]:
    """One job through the simulator and the diagnosis: its step rows, its anomalies (each id's
    versions in the order emitted) and the diagnosis time (s)."""
    from argus.sinks import to_arrow

    assert _FLEET is not None
    job = _FLEET.jobs[index]
    diag = JobDiagnoser(job.job, 0)
    emitted: list[Anomaly] = []
    batches = []
    spent = 0.0
    for s in _FLEET.run(job):
        batches.append(s.batch)
        t = time.perf_counter()
        res = diag.step(s.batch, kernels=s.kernel_stats, stacks=s.stacks, names=KERNEL_NAMES)
        spent += time.perf_counter() - t
        emitted.extend(res.anomalies)
    emitted.extend(diag.flush())
    return index, to_arrow(batches)[1], emitted, spent


@dataclass
class Month:
    """The simulated month's outcome."""

    recall: float
    false_nodes: list[str]
    jobs_to_detection: list[int]
    days_to_detection: list[float]
    detected: dict[str, str]
    decided_by: dict[str, str]
    missed: list[str]
    jobs: int
    steps: int
    anomalies: int
    step_ms: float
    view_ms: list[float]
    checks: int


def month(params: dict[str, float], workers: int, folder: Path) -> Month:
    """Simulate, diagnose and store the fleet's jobs (unless ``folder`` holds them from a
    ``--keep`` run with the same mode), then check the fleet view every 12 h."""
    from argus.fleet import fleet_view
    from argus.sinks import ChdbStore, migrate, to_arrow

    fleet = _fleet(params)
    reuse = (folder / "month" / "done").is_file()
    store = ChdbStore(folder / "month")
    migrate(store)
    steps_rows = anomalies = 0
    spent = 0.0
    if reuse:
        steps_rows = int(store.query_rows("SELECT count() FROM steps")[0][0])
        anomalies = int(store.query_rows("SELECT uniqExact(id) FROM anomalies")[0][0])
    ctx = mp.get_context("fork")
    with ctx.Pool(1 if reuse else workers, initializer=_init, initargs=(params,)) as pool:
        pending_steps: list[pa.Table] = []
        pending_anoms: list[Anomaly] = []
        order = sorted(range(len(fleet.jobs)), key=lambda i: fleet.jobs[i].start_ns)

        def flush() -> None:
            if pending_steps:
                store.insert_arrow("steps", pa.concat_tables(pending_steps))
            if pending_anoms:
                store.insert_arrow("anomalies", to_arrow(pending_anoms)[1])
            pending_steps.clear()
            pending_anoms.clear()

        t0 = time.perf_counter()
        work = [] if reuse else order
        for done, (_, table, emitted, s) in enumerate(pool.imap(diagnose_job, work, chunksize=4), 1):
            pending_steps.append(table)
            pending_anoms.extend(emitted)
            steps_rows += table.num_rows
            anomalies += len({a.id for a in emitted})
            spent += s
            if len(pending_steps) >= 50:
                flush()
            if done % 200 == 0:
                print(
                    f"  {done:,}/{len(order):,} jobs diagnosed ({time.perf_counter() - t0:.0f} s)", flush=True
                )
        flush()
    if not reuse:
        for samples in fleet.gpu_samples():
            store.insert_arrow("gpu_samples", to_arrow(samples)[1])
        (folder / "month" / "done").write_text("diagnosed and stored\n")

    start = datetime.fromtimestamp(fleet.start_ns / 1e9, UTC)
    end = datetime.fromtimestamp(fleet.end_ns / 1e9, UTC)
    onset = {fleet.node_names[b.node]: datetime.fromtimestamp(b.onset_ns / 1e9, UTC) for b in fleet.bad}
    detected: dict[str, datetime] = {}
    decided_by: dict[str, str] = {}
    false_nodes: set[str] = set()
    view_ms: list[float] = []
    checks = 0
    t = start + CHECK_EVERY
    while t <= end:
        q = time.perf_counter()
        view = fleet_view(store, since=max(start, t - WINDOW), until=t)
        view_ms.append((time.perf_counter() - q) * 1e3)
        checks += 1
        for node in view.suspects:
            if node.host in onset and onset[node.host] <= t:
                detected.setdefault(node.host, t)
                decided_by.setdefault(node.host, node.decided_by)
            else:
                false_nodes.add(node.host)
        t += CHECK_EVERY
    store.close()

    jobs_to: list[int] = []
    days_to: list[float] = []
    for host, when in detected.items():
        index = fleet.node_of(host)
        affected = [j for j in fleet.jobs if index in j.bad and j.start_ns < when.timestamp() * 1e9]
        jobs_to.append(len(affected))
        days_to.append((when - onset[host]).total_seconds() / 86400)
    kinds = {fleet.node_names[b.node]: b.kind for b in fleet.bad}
    return Month(
        recall=len(detected) / len(onset) if onset else 1.0,
        false_nodes=sorted(false_nodes),
        jobs_to_detection=jobs_to,
        days_to_detection=days_to,
        detected={h: kinds[h] for h in detected},
        decided_by=decided_by,
        missed=[
            f"{h} ({kinds[h]}): slowed {sum(fleet.node_of(h) in j.bad for j in fleet.jobs)} jobs in all"
            for h in onset
            if h not in detected
        ],
        jobs=len(fleet.jobs),
        steps=steps_rows,
        anomalies=anomalies,
        step_ms=spent / max(sum(j.steps for j in fleet.jobs), 1) * 1e3,
        view_ms=view_ms,
        checks=checks,
    )


# The scale store: filled in SQL (seconds, not hours of simulation). 8 GPUs per host; jobs of
# 64 ranks on 8 random hosts; anomalies of 70 % one rank, 15 % a link (2 hosts), 10 % a
# host (8 ranks), 5 % a stage (no node); a fifth stored again with a longer window. Every
# rank's compute over its job (rank_work_days: two stages of 32 ranks, 3,000 steps, within 2 %
# of its peers, 15 % slower in one rank-job in 500 and always on GPU 3 of 20 hosts).
_SCALE_FILL = """
INSERT INTO node_hours (host, hour, gpu_ms, steps)
SELECT concat('host-', leftPad(toString(number % {hosts}), 5, '0')),
       toStartOfHour({t0:DateTime}) + toIntervalHour(intDiv(number, {hosts})),
       8 * 3.6e6 * (0.5 + (cityHash64(number) % 1000) / 2000.0), 9000
FROM numbers({hosts} * 24 * {days});

INSERT INTO rank_placement (job, run, rank, host, gpu_uuid, first_time, last_time)
SELECT concat('job-', toString(intDiv(number, 64))), 0, number % 64,
       concat('host-', leftPad(toString(cityHash64(intDiv(number, 64), intDiv(number % 64, 8)) % {hosts}), 5, '0')),
       concat('GPU-', toString(cityHash64(intDiv(number, 64), intDiv(number % 64, 8)) % {hosts}), '-', toString(number % 8)),
       {t0:DateTime}, {t0:DateTime}
FROM numbers({jobs} * 64);

INSERT INTO gpu_health_daily (host, gpu_uuid, day, samples, xid_samples, xids, throttled, ecc_min, ecc_max,
                              link_err_min, link_err_max)
SELECT concat('host-', leftPad(toString(intDiv(number, 8) % {hosts}), 5, '0')),
       concat('GPU-', toString(intDiv(number, 8) % {hosts}), '-', toString(number % 8)),
       toDate({t0:DateTime}) + intDiv(number, 8 * {hosts}), 8640,
       cityHash64(number) % 500 = 0, if(cityHash64(number) % 500 = 0, [13], []),
       cityHash64(number, 1) % 200 = 0, 0, cityHash64(number, 2) % 5000 = 0, 0, 0
FROM numbers(8 * {hosts} * {days});

INSERT INTO rank_work_days (day, job_key, pp, rank, job, run, host, gpu_uuid, gpu_key, first_time, last_time, steps,
                            compute_sum)
SELECT toDate(t), cityHash64(job, 0), intDiv(r, 32), r, job, 0, host, gpu, cityHash64(host, gpu), t,
       t + INTERVAL 2 HOUR, 3000,
       3000 * 300.0 * (1.0 + (cityHash64(number, 5) % 1000) / 50000.0)
                    * if(cityHash64(number, 6) % 500 = 0 OR (node < 20 AND r % 8 = 3), 1.15, 1.0)
FROM (SELECT number, j, r, node, concat('job-', toString(j)) AS job,
             concat('host-', leftPad(toString(node), 5, '0')) AS host,
             concat('GPU-', toString(node), '-', toString(r % 8)) AS gpu,
             {t0:DateTime} + toIntervalSecond(cityHash64(j, 7) % ({days} * 86400)) AS t
      FROM (SELECT number, intDiv(number, 64) AS j, number % 64 AS r,
                   cityHash64(intDiv(number, 64), intDiv(number % 64, 8)) % {hosts} AS node
            FROM numbers({jobs} * 64)));

INSERT INTO anomalies (id, job, run, start_step, end_step, level, suspect_kind, suspect, ranks, cause, score,
                       summary, step_ms_added, gpu_hours_lost, time, severity)
SELECT concat('a', toString(n)), concat('job-', toString(j)), 0, 100, 200 + v * 50, 'cross_rank',
       multiIf(k < 70, 'rank', k < 85, 'link', k < 95, 'host', 'stage'),
       '', multiIf(k < 70, [toUInt32(r)], k < 85, [toUInt32(r), toUInt32((r + 8) % 64)],
                   k < 95, arrayMap(x -> toUInt32(intDiv(r, 8) * 8 + x), range(8)), []),
       [ 'compute_straggler', 'link_degradation', 'host_cpu_contention', 'dataloader_stall', 'gc_pause',
         'pipeline_stage_imbalance'][1 + cityHash64(n, 3) % 6],
       3.0, '', 40.0, 0.5 + v, {t0:DateTime} + toIntervalSecond(cityHash64(n, 4) % ({days} * 86400)), 'page'
FROM (SELECT number AS n, intDiv(number, 10) % {jobs} AS j, cityHash64(number, 1) % 100 AS k,
             cityHash64(number, 2) % 64 AS r, 0 AS v FROM numbers({anomalies})
      UNION ALL
      SELECT number * 5 AS n, intDiv(number * 5, 10) % {jobs} AS j, cityHash64(number * 5, 1) % 100 AS k,
             cityHash64(number * 5, 2) % 64 AS r, 1 AS v FROM numbers(intDiv({anomalies}, 5)));
"""


class Timed:
    """A store that times every query it runs, by the calling view (``label``) and the table
    it reads (the evidence queries name their hosts)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.label = ""
        self.runs: dict[str, list[float]] = {}

    def query_rows(self, sql: str, params: Any = None) -> Any:
        t = time.perf_counter()
        out = self._store.query_rows(sql, params)
        if self.label:
            m = re.search(r"FROM (\w+)", sql)
            table = (m.group(1) if m else "?") + (" (hosts)" if "{hosts:String}" in sql else "")
            self.runs.setdefault(f"{self.label}: {table}", []).append((time.perf_counter() - t) * 1e3)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def scale(folder: Path, anomalies: int, hosts: int, days: int = 30) -> dict[str, object]:
    """Fill a fresh store at fleet scale and time the fleet view's queries (this process)."""
    from argus.detectors.fleet import NODE_CAUSES, NODE_SUSPECT_KINDS
    from argus.fleet import fleet_view
    from argus.sinks import ChdbStore, migrate
    from argus.sinks.fleet import node_evidence
    from argus.sinks.store import split_statements

    shutil.rmtree(folder, ignore_errors=True)  # a kept folder's earlier scale store
    store = ChdbStore(folder)
    migrate(store)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    fill = {"hosts": hosts, "days": days, "jobs": max(anomalies // 10, 1), "anomalies": anomalies}
    t = time.perf_counter()
    sql = _SCALE_FILL
    for k, v in fill.items():
        sql = sql.replace("{" + k + "}", str(v))
    for statement in split_statements(sql):
        store.execute(statement, {"t0": t0.replace(tzinfo=None)})
    fill_s = time.perf_counter() - t
    # A bulk fill leaves hundreds of parts that a live store's background merges would have
    # merged long since (the rollups are fed a little every second): time the merged state.
    tables = (
        "anomalies",
        "anomaly_nodes",
        "node_jobs",
        "node_hours",
        "node_days",
        "rank_placement",
        "gpu_health_daily",
        "rank_work_days",
    )
    for table in tables:
        store.execute(f"OPTIMIZE TABLE {table} FINAL")
    merge_s = time.perf_counter() - t - fill_s
    counts = {name: int(store.query_rows(f"SELECT count() FROM {name}")[0][0]) for name in tables}
    counts["hosts"] = int(store.query_rows("SELECT uniqExact(host) FROM node_hours")[0][0])
    counts["anomaly_ids"] = int(store.query_rows("SELECT uniqExact(id) FROM anomalies")[0][0])
    until = t0 + timedelta(days=days)
    since = until - timedelta(days=7)
    top = [
        str(r[0])
        for r in store.query_rows(
            "SELECT host FROM anomaly_nodes GROUP BY host ORDER BY uniqExact(job) DESC LIMIT 20"
        )
    ]
    timed = Timed(store)
    calls: dict[str, Callable[[], object]] = {
        "fleet_view_7d": lambda: fleet_view(timed, since=since, until=until),
        "fleet_view_30d": lambda: fleet_view(timed, since=t0, until=until),
        "evidence_top20_7d": lambda: node_evidence(
            timed, since, until, top, causes=NODE_CAUSES, kinds=NODE_SUSPECT_KINDS
        ),
    }
    runs: dict[str, list[float]] = {}
    for name, call in calls.items():
        call()  # warm-up
        for _ in range(4):
            timed.label = name
            t = time.perf_counter()
            call()
            runs.setdefault(f"{name} (all)", []).append((time.perf_counter() - t) * 1e3)
        timed.label = ""
    for key, ms in timed.runs.items():
        runs[key] = ms
    store.close()
    return {"fill_s": fill_s, "merge_s": merge_s, "counts": counts, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smaller fleet over two weeks")
    ap.add_argument("--smoke", action="store_true", help="a few jobs and a small scale store: it runs")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes diagnosing jobs")
    ap.add_argument("--scale-only", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--skip-scale", action="store_true", help="the month only")
    ap.add_argument(
        "--keep",
        metavar="DIR",
        help="keep the month's store in DIR; a later run with the same mode and DIR re-checks it only",
    )
    args = ap.parse_args()
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    params = MODES[mode]
    if args.scale_only:  # the scale store in its own process: chDB opens one folder per process
        print(json.dumps(scale(Path(args.scale_only), int(params["anomalies"]), int(params["hosts"]))))
        return

    with tempfile.TemporaryDirectory(prefix="argus-bench-fleet-") as tmp:
        folder = Path(args.keep or tmp)
        print(
            f"fleet ({mode}): {params['nodes']} nodes, {params['jobs']:,} jobs over {params['days']:.0f} days, "
            f"{params['bad_nodes']} bad nodes; {args.workers} workers"
        )
        t = time.perf_counter()
        m = month(params, max(args.workers, 1), folder)
        month_s = time.perf_counter() - t
        sc: dict[str, object] = {}
        if not args.skip_scale:
            cmd = [sys.executable, __file__, "--scale-only", str(folder / "scale")]
            cmd += ["--smoke"] if args.smoke else ["--quick"] if args.quick else []
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise SystemExit(f"the scale run failed:\n{out.stderr[-3000:]}")
            sc = json.loads(out.stdout.strip().splitlines()[-1])

    p50 = float(np.median(m.jobs_to_detection)) if m.jobs_to_detection else float("nan")
    print(f"\nthe month: {m.jobs:,} jobs, {m.steps:,} step rows, {m.anomalies:,} anomalies, {m.checks} checks "
          f"of the 7-day view ({month_s:.0f} s; " + (f"diagnosis {m.step_ms:.2f} ms per job step)" if m.step_ms
          else "a kept store, re-checked)"))  # fmt: skip
    print(f"{'bad node':<16} {'kind':<16} {'jobs to detection':>18} {'days':>6}  first named by")
    for (host, kind), jobs, days in zip(
        m.detected.items(), m.jobs_to_detection, m.days_to_detection, strict=True
    ):
        print(f"{host:<16} {kind:<16} {jobs:>18} {days:>6.1f}  {m.decided_by[host]}")
    for miss in m.missed:
        print(f"{'missed':<16} {miss}")
    print(f"false suspect nodes: {len(m.false_nodes)} {m.false_nodes if m.false_nodes else ''}")
    print(f"fleet view per check: median {statistics.median(m.view_ms):.0f} ms, max {max(m.view_ms):.0f} ms")
    query_max = view_ms = float("nan")
    if sc:
        counts = sc["counts"]
        assert isinstance(counts, dict) and isinstance(sc["runs"], dict)
        print(
            f"\nscale: {counts['anomaly_ids']:,} anomalies ({counts['anomalies']:,} rows), {counts['hosts']:,} "
            f"hosts, {counts['anomaly_nodes']:,} anomaly-node rows, {counts['node_jobs']:,} node-job rows, "
            f"{counts['rank_placement']:,} placements, {counts['rank_work_days']:,} rank-job-days, "
            f"{counts['node_hours']:,} host-hours, {counts['gpu_health_daily']:,} GPU-days "
            f"(filled in {float(sc['fill_s']):.0f} s, merged in {float(sc['merge_s']):.0f} s)"  # type: ignore[arg-type]
        )
        print(f"{'query (4 runs after a warm-up)':<44} {'median ms':>10} {'max ms':>8}")
        for name, runs in sc["runs"].items():
            print(f"{name:<44} {statistics.median(runs):>10.0f} {max(runs):>8.0f}")
        query_max = max(max(r) for k, r in sc["runs"].items() if not k.endswith("(all)"))
        view_ms = statistics.median(sc["runs"]["fleet_view_7d (all)"])
    print(
        json.dumps(
            {
                "mode": mode,
                "bad_node_recall": round(m.recall, 3),
                "false_suspect_nodes": len(m.false_nodes),
                "jobs_to_detection_p50": p50,
                "days_to_detection_p50": round(float(np.median(m.days_to_detection)), 2)
                if m.days_to_detection
                else None,
                "fleet_query_ms_max": round(query_max, 1),
                "fleet_view_7d_ms_p50": round(view_ms, 1) if sc else None,
                "jobs": m.jobs,
                "anomalies": m.anomalies,
            }
        )
    )


if __name__ == "__main__":
    main()
