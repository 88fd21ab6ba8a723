"""A small fleet written into a store the way the sink writes it (steps, anomalies, NVML
samples through ``to_arrow``), for the fleet view's sink and CLI tests: one bad host that
five jobs found slow, healthy hosts, one of them unlucky once, and anomalies that implicate
no node (a pipeline stage, a GC pause)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from argus.schemas import Anomaly, GpuSample, StepBatch
from argus.sinks import to_arrow

__all__ = ["HealthFleet", "SmallFleet", "health_fleet", "job_steps", "small_fleet"]

GPUS = 8
STEP_MS = 1000.0


def job_steps(job: str, hosts: list[str], t0_ns: int, steps: int = 20) -> list[StepBatch]:
    """``steps`` steps of 1 s of a job with ``GPUS`` ranks on each of ``hosts``."""
    n = len(hosts) * GPUS
    out = []
    for s in range(steps):
        cols = StepBatch.empty_columns(n)
        rank = np.arange(n)
        start = t0_ns + s * int(STEP_MS * 1e6)
        cols.update(
            rank=rank,
            host=np.array([hosts[r // GPUS] for r in range(n)], dtype=object),
            gpu_uuid=np.array([f"GPU-{hosts[r // GPUS]}-{r % GPUS}" for r in range(n)], dtype=object),
            dp=rank // GPUS,
            tp=rank % GPUS,
            start_ns=np.full(n, start),
            end_ns=np.full(n, start + int(STEP_MS * 1e6)),
            forward_ms=np.full(n, 300.0),
            backward_ms=np.full(n, 600.0),
        )
        out.append(StepBatch(job, 0, s, cols))
    return out


def anomaly(
    id_: str,
    job: str,
    ranks: tuple[int, ...],
    kind: str,
    cause: str,
    t_ns: int,
    lost: float,
    end_step: int = 15,
) -> Anomaly:
    """An anomaly as the diagnosis stores it (only what the fleet view reads is meaningful)."""
    return Anomaly(
        id_, job, 0, 5, end_step, "cross_rank", kind, kind, ranks, cause, 4.0, {"z": 4.0}, "",
        100.0, lost, t_ns,
    )  # fmt: skip


@dataclass(frozen=True)
class SmallFleet:
    """What :func:`small_fleet` wrote: names, the bad host, its anomalies' ids, the window."""

    hosts: list[str]
    bad: str
    bad_ids: list[str]
    unlucky: str
    start_ns: int
    end_ns: int
    jobs: list[str]
    exposure_s: dict[str, float]


def small_fleet(
    store: object, tag: str, t0_ns: int, *, n_hosts: int = 20, n_jobs: int = 14, bad_jobs: int = 6
) -> SmallFleet:
    """Write the small fleet (names prefixed with ``tag``) with its jobs one hour apart: the
    bad host hosts the first ``bad_jobs`` jobs and all but the last of them find it slow."""
    rng = np.random.default_rng(5)
    hosts = [f"{tag}-h{i:02d}" for i in range(n_hosts)]
    bad, unlucky = hosts[7], hosts[11]
    others = [h for h in hosts if h != bad]
    jobs, bad_ids, anomalies, exposure = [], [], [], dict.fromkeys(hosts, 0.0)
    for j in range(n_jobs):
        job = f"{tag}-job{j:02d}"
        placed = [str(h) for h in rng.choice(others, 4, replace=False)]
        if j < bad_jobs:
            placed[j % 4] = bad
        if j == bad_jobs + 2 and unlucky not in placed:
            placed[0] = unlucky
        t = t0_ns + j * 3_600 * 10**9
        batches = job_steps(job, placed, t)
        store.insert_arrow("steps", to_arrow(batches)[1])  # type: ignore[attr-defined]
        for h in placed:
            exposure[h] += GPUS * STEP_MS / 1e3 * len(batches)
        jobs.append(job)
        found = t + 10 * 10**9
        if j < bad_jobs - 1:  # the bad host's GPU 3, in all but one of the jobs it hosted
            rank = placed.index(bad) * GPUS + 3
            bad_ids.append(f"{tag}-bad{j}")
            anomalies.append(anomaly(bad_ids[-1], job, (rank,), "rank", "compute_straggler", found, 0.01))
        if j == bad_jobs + 2:  # a healthy host unlucky once: a link between it and a neighbour
            i = placed.index(unlucky)
            link = (i * GPUS, ((i + 1) % 4) * GPUS)
            anomalies.append(anomaly(f"{tag}-link", job, link, "link", "link_degradation", found, 0.02))
        if j == bad_jobs + 3:  # the workload and the job's own code implicate no node
            anomalies.append(
                anomaly(f"{tag}-stage", job, (), "stage", "pipeline_stage_imbalance", found, 0.5)
            )
            anomalies.append(anomaly(f"{tag}-gc", job, (5,), "rank", "gc_pause", found, 0.001))
    # the first anomaly again, its window grown: one anomaly, its latest cost
    anomalies.append(anomaly(bad_ids[0], f"{tag}-job00", anomalies[0].ranks, "rank", "compute_straggler",
                             anomalies[0].detected_ns, 0.04, end_step=19))  # fmt: skip
    store.insert_arrow("anomalies", to_arrow(anomalies)[1])  # type: ignore[attr-defined]
    samples = []
    for h in hosts:
        for g in range(GPUS):
            for i, t in enumerate((t0_ns, t0_ns + 6 * 3_600 * 10**9)):
                throttled = h == bad and g == 3
                samples.append(
                    GpuSample(
                        h, f"GPU-{h}-{g}", g, t,
                        clock_event_reasons=0x40 if throttled else (0x1 if h == unlucky else 0),
                        xid=79 if (h == bad and g == 3 and i == 1) else 0,
                        ecc_dbe=2 * i if throttled else 5,
                    )
                )  # fmt: skip
    store.insert_arrow("gpu_samples", to_arrow(samples)[1])  # type: ignore[attr-defined]
    end = t0_ns + n_jobs * 3_600 * 10**9
    return SmallFleet(hosts, bad, bad_ids, unlucky, t0_ns, end, jobs, exposure)


@dataclass(frozen=True)
class HealthFleet:
    """What :func:`health_fleet` wrote: the hosts, the throttling host that two jobs found slow
    at its throttling GPU (``throttling``, GPU ``gpu``), a host throttling the same way that
    one job found slow (``quiet``), a host two jobs found slow without any health event
    (``jobs_only``), and the window."""

    hosts: list[str]
    throttling: str
    gpu: str
    quiet: str
    jobs_only: str
    start_ns: int
    end_ns: int


def health_fleet(store: object, tag: str, t0_ns: int, *, n_hosts: int = 40, n_jobs: int = 30) -> HealthFleet:
    """A fleet of ``n_hosts`` whose jobs (one an hour, 4 hosts each) are mostly healthy, with a
    few background anomalies on random hosts, NVML samples every 4 hours with a stray thermal
    event or XID here and there, and three hosts of interest (:class:`HealthFleet`)."""
    rng = np.random.default_rng(9)
    hosts = [f"{tag}-h{i:02d}" for i in range(n_hosts)]
    throttling, quiet, jobs_only = hosts[3], hosts[17], hosts[29]
    special = {throttling: (0, 1), quiet: (2,), jobs_only: (3, 4)}  # the jobs that find each slow
    pool = [h for h in hosts if h not in special]
    gpu_of = {throttling: 2, quiet: 5, jobs_only: 1}
    anomalies = []
    for j in range(n_jobs):
        job = f"{tag}-job{j:02d}"
        placed = [str(h) for h in rng.choice(pool, 4, replace=False)]
        mine = [h for h, js in special.items() if j in js]
        for k, h in enumerate(mine):
            placed[k] = h
        t = t0_ns + j * 3_600 * 10**9
        store.insert_arrow("steps", to_arrow(job_steps(job, placed, t))[1])  # type: ignore[attr-defined]
        found = t + 10 * 10**9
        for h in mine:
            rank = placed.index(h) * GPUS + gpu_of[h]
            anomalies.append(
                anomaly(f"{tag}-a{j}-{h}", job, (rank,), "rank", "compute_straggler", found, 0.01)
            )
        if j % 7 == 5:  # the background: a healthy host's one bad job
            rank = int(rng.integers(len(mine), 4)) * GPUS + int(rng.integers(0, GPUS))
            anomalies.append(anomaly(f"{tag}-bg{j}", job, (rank,), "rank", "compute_straggler", found, 0.01))
    store.insert_arrow("anomalies", to_arrow(anomalies)[1])  # type: ignore[attr-defined]
    samples = []
    rounds = max(n_jobs // 4, 1)
    for h in hosts:
        for g in range(GPUS):
            for i in range(rounds):
                hot = h in (throttling, quiet) and g == gpu_of[h] and i % 4 != 0  # 3 rounds in 4
                stray = rng.random()
                samples.append(
                    GpuSample(
                        h, f"GPU-{h}-{g}", g, t0_ns + i * 4 * 3_600 * 10**9,
                        clock_event_reasons=0x40 if hot else (0x20 if stray < 0.004 else 0),
                        xid=13 if 0.004 <= stray < 0.006 else 0,
                    )
                )  # fmt: skip
    store.insert_arrow("gpu_samples", to_arrow(samples)[1])  # type: ignore[attr-defined]
    return HealthFleet(
        hosts, throttling, f"GPU-{throttling}-2", quiet, jobs_only, t0_ns, t0_ns + n_jobs * 3_600 * 10**9
    )
