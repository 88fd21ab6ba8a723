"""A shared fleet over weeks: many small jobs placed at random on hundreds of nodes, a few
truly bad nodes, background faults that make healthy nodes unlucky once, and the node
agent's health samples (XIDs, ECC, clock-throttle reasons).

Each job is a :class:`ClusterSimulator` whose hosts and GPUs are renamed to the fleet nodes
it was placed on, so what the diagnosis names (a rank's host, a host, a link between two
hosts) is a fleet node. Nothing here decides what is anomalous: a bad node only slows the
jobs it hosts, the way its kind of fault does, and the diagnosis engine finds what it finds.

The bad-node kinds:

- ``slow_gpu``: one GPU computes 1.15-1.4x slower, in every job, no health event.
- ``throttling``: one GPU's matrix multiplies run slower while it throttles (a part of each
  job), with thermal / hardware-slowdown clock-event reasons in its NVML samples.
- ``flaky_link``: the node's network link is 2-4x slower for a part of each job (towards
  whichever peer the job gives it), with NVLink/network error counts rising.
- ``starved_loaders``: the host's CPUs starve its data loaders (host CPU contention).

A bad node shows in a job it hosts with probability ``manifest`` (intermittent faults miss
some jobs). Background: each job draws, with probability ``background``, a fault of any
class on random culprits (a healthy node's one bad day, the workload's imbalance), and
healthy GPUs report a stray XID or thermal event now and then.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from argus.schemas import GpuSample, StepBatch

from ._cluster import START_NS, ClusterSimulator, SimStep
from ._faults import (
    CHECKPOINT_STALL,
    COMPUTE_STRAGGLER,
    DATALOADER_STALL,
    GC_PAUSE,
    HOST_CPU_CONTENTION,
    JIT_COMPILE_STALL,
    LINK_DEGRADATION,
    PIPELINE_STAGE_IMBALANCE,
    SEQUENCE_LENGTH_IMBALANCE,
    Fault,
    random_fault,
)
from ._layout import Layout

__all__ = ["BAD_NODE_KINDS", "THROTTLE_REASONS", "BadNode", "FleetJob", "FleetSimulator"]

BAD_NODE_KINDS = ("slow_gpu", "throttling", "flaky_link", "starved_loaders")
"""The kinds of truly bad node the simulator plants."""

THROTTLE_REASONS = 0x08 | 0x20 | 0x40 | 0x80
"""NVML clock-event reasons that mean the GPU slowed itself: hardware slowdown, software and
hardware thermal slowdown, hardware power brake (``nvmlClocksEventReason*``)."""

_BACKGROUND_KINDS = (
    COMPUTE_STRAGGLER,
    LINK_DEGRADATION,
    HOST_CPU_CONTENTION,
    PIPELINE_STAGE_IMBALANCE,
    SEQUENCE_LENGTH_IMBALANCE,
    DATALOADER_STALL,
    GC_PAUSE,
    JIT_COMPILE_STALL,
    CHECKPOINT_STALL,
)
_LAYOUTS = (Layout(dp=4, tp=8), Layout(dp=6, tp=8), Layout(dp=4, tp=4, pp=2), Layout(dp=8, tp=8))
"""Small jobs (32-64 GPUs, 4-8 hosts): enough hosts that one host is not the job."""


@dataclass(frozen=True)
class BadNode:
    """Ground truth: node index ``node`` turns bad of ``kind`` at ``onset_ns`` (GPU ``gpu``
    for the GPU kinds)."""

    node: int
    kind: str
    onset_ns: int
    gpu: int


@dataclass(frozen=True)
class FleetJob:
    """One job: its fleet nodes (job host index -> node index), layout, steps, start, the
    faults injected (job-local ranks) and the bad nodes that showed in it."""

    index: int
    job: str
    seed: int
    start_ns: int
    layout: Layout
    steps: int
    nodes: tuple[int, ...]
    faults: tuple[Fault, ...]
    bad: tuple[int, ...]


class FleetSimulator:
    """Hundreds of nodes, thousands of jobs over weeks, deterministic from ``seed``.

    Args:
        nodes: fleet size (hosts of ``gpus_per_host`` GPUs).
        jobs: jobs over the period, started at uniform random times.
        days: the period simulated.
        bad_nodes: truly bad nodes, kinds in turn from :data:`BAD_NODE_KINDS`, each turning
            bad at a random time in the first ``onset_within`` of the period.
        steps: (min, max) steps per job.
        manifest: the chance that a bad node slows a job it hosts.
        background: the chance that a job carries a background fault.
        seed: everything random derives from it.
    """

    def __init__(
        self,
        *,
        nodes: int = 300,
        jobs: int = 2000,
        days: float = 30.0,
        bad_nodes: int = 8,
        steps: tuple[int, int] = (100, 160),
        manifest: float = 0.85,
        background: float = 0.35,
        onset_within: float = 0.6,
        gpus_per_host: int = 8,
        seed: int = 0,
    ) -> None:
        if nodes < 16 or jobs < 1 or days <= 0 or not 0 <= bad_nodes <= nodes // 4:
            raise ValueError("a fleet needs >= 16 nodes, >= 1 job, days > 0 and at most nodes/4 bad nodes")
        if steps[0] < 60 or steps[1] < steps[0]:
            raise ValueError("jobs need at least 60 steps (the diagnosis learns the job first)")
        self.n_nodes = nodes
        self.n_jobs = jobs
        self.days = days
        self.gpus_per_host = gpus_per_host
        self.seed = seed
        self.start_ns = START_NS
        self.end_ns = START_NS + int(days * 86_400e9)
        self.node_names = tuple(f"gpu-node-{i:04d}" for i in range(nodes))
        tag = hashlib.sha1(f"fleet/{seed}".encode()).hexdigest()[:6]
        self.gpu_uuids = tuple(
            tuple(f"GPU-{tag}-{i:04d}-{g}" for g in range(gpus_per_host)) for i in range(nodes)
        )
        rng = np.random.default_rng([seed, 0])
        chosen = rng.choice(nodes, bad_nodes, replace=False)
        span = int(days * 86_400e9 * onset_within)
        self.bad = tuple(
            BadNode(
                int(n),
                BAD_NODE_KINDS[i % len(BAD_NODE_KINDS)],
                START_NS + int(rng.integers(0, max(span, 1))),
                int(rng.integers(0, gpus_per_host)),
            )
            for i, n in enumerate(chosen)
        )
        self._bad_of = {b.node: b for b in self.bad}
        self._steps = steps
        self._manifest = manifest
        self._background = background
        self.jobs = tuple(self._job(i) for i in range(jobs))

    def _job(self, i: int) -> FleetJob:
        rng = np.random.default_rng([self.seed, 1, i])
        layout = dataclasses.replace(
            _LAYOUTS[int(rng.integers(0, len(_LAYOUTS)))], gpus_per_host=self.gpus_per_host
        )
        steps = int(rng.integers(self._steps[0], self._steps[1] + 1))
        start = self.start_ns + int(rng.uniform(0, self.end_ns - self.start_ns - 3.6e12))
        nodes = tuple(int(n) for n in rng.choice(self.n_nodes, layout.n_hosts, replace=False))
        faults: list[Fault] = []
        bad: list[int] = []
        for h, node in enumerate(nodes):
            b = self._bad_of.get(node)
            if b is None or b.onset_ns > start or rng.random() >= self._manifest:
                continue
            faults.append(self._bad_fault(b, h, layout, steps, rng))
            bad.append(node)
        if rng.random() < self._background:
            kind = _BACKGROUND_KINDS[int(rng.integers(0, len(_BACKGROUND_KINDS)))]
            first = int(rng.integers(30, steps - 30))
            faults.append(random_fault(kind, layout, rng, first))
        return FleetJob(i, f"fleet-job-{i:05d}", int(rng.integers(0, 2**31)), start, layout, steps, nodes,
                        tuple(faults), tuple(bad))  # fmt: skip

    @staticmethod
    def _bad_fault(b: BadNode, h: int, layout: Layout, steps: int, rng: np.random.Generator) -> Fault:
        """What bad node ``b`` (job host index ``h``) does to a job of ``steps`` steps."""
        gpu_rank = min(h * layout.gpus_per_host + b.gpu, layout.n_ranks - 1)
        if b.kind == "slow_gpu":
            return Fault(COMPUTE_STRAGGLER, 0, steps, (gpu_rank,), magnitude=float(rng.uniform(1.15, 1.4)))
        first = int(rng.integers(20, steps // 2))
        length = int(rng.integers(30, steps - first + 1))
        if b.kind == "throttling":
            return Fault(
                COMPUTE_STRAGGLER,
                first,
                length,
                (gpu_rank,),
                magnitude=float(rng.uniform(1.3, 1.7)),
                kernel="gemm",
            )
        if b.kind == "flaky_link":
            c = layout.coords
            peer = layout.rank_at(pp=int(c["pp"][gpu_rank]), dp=(int(c["dp"][gpu_rank]) + 1) % layout.dp,
                                  tp=int(c["tp"][gpu_rank]), cp=int(c["cp"][gpu_rank]))  # fmt: skip
            return Fault(
                LINK_DEGRADATION, first, length, (gpu_rank, peer), magnitude=float(rng.uniform(2.0, 4.0))
            )
        return Fault(HOST_CPU_CONTENTION, first, length, host=h, magnitude=float(rng.uniform(20.0, 60.0)))

    def node_of(self, name: str) -> int:
        """The node index of a node name (``gpu-node-0042`` -> 42)."""
        return self.node_names.index(name)

    def simulator(self, job: FleetJob) -> ClusterSimulator:
        """The job's cluster simulator (job-local host names; :meth:`run` renames them)."""
        return ClusterSimulator(
            job.layout, seed=job.seed, job=job.job, faults=job.faults, start_ns=job.start_ns
        )

    def run(self, job: FleetJob) -> Iterator[SimStep]:
        """The job's steps, its hosts and GPUs named as the fleet nodes it was placed on."""
        sim = self.simulator(job)
        lay = job.layout
        c = lay.coords
        node = np.asarray(job.nodes)[c["host"]]
        hosts = np.asarray(self.node_names, dtype=object)[node]
        uuids = np.array([self.gpu_uuids[n][g] for n, g in zip(node.tolist(), c["gpu"].tolist(), strict=True)],
                         dtype=object)  # fmt: skip
        for s in sim.run(job.steps):
            cols = dict(s.batch.columns)
            cols["host"], cols["gpu_uuid"] = hosts, uuids
            yield dataclasses.replace(s, batch=StepBatch(s.batch.job, s.batch.run, s.batch.step, cols))

    def gpu_samples(self, every_s: float = 21_600.0) -> Iterator[list[GpuSample]]:
        """The node agents' NVML samples, one list per sampling round over the period: clocks
        and temperature of every GPU; XIDs, ECC and throttle reasons where something happened
        (a throttling node while bad, a flaky link's error counts, stray events elsewhere)."""
        rng = np.random.default_rng([self.seed, 2])
        n, g = self.n_nodes, self.gpus_per_host
        ecc = np.zeros((n, g), np.int64)
        link_err = np.zeros((n, g), np.int64)
        t = self.start_ns
        step = int(every_s * 1e9)
        while t < self.end_ns:
            reasons = np.zeros((n, g), np.int64)
            xid = np.zeros((n, g), np.int64)
            stray = rng.random((n, g))
            reasons[stray < 0.002] = 0x20  # a healthy GPU's brief thermal slowdown
            xid[(stray > 0.9995)] = 13  # a stray application error (graphics engine exception)
            for b in self.bad:
                if t < b.onset_ns:
                    continue
                if b.kind == "throttling" and rng.random() < 0.5:
                    reasons[b.node, b.gpu] = 0x40 | 0x08
                elif b.kind == "flaky_link":
                    link_err[b.node, b.gpu] += int(rng.poisson(3.0))
                elif b.kind == "slow_gpu" and rng.random() < 0.02:
                    ecc[b.node, b.gpu] += 1
            temp = 55.0 + 10.0 * rng.random((n, g)) + 25.0 * (reasons & 0x40 > 0)
            yield [
                GpuSample(
                    self.node_names[i],
                    self.gpu_uuids[i][k],
                    k,
                    t,
                    gpu_util=90.0,
                    sm_clock_mhz=1410.0 if not reasons[i, k] & THROTTLE_REASONS else 990.0,
                    power_w=600.0,
                    temp_c=float(temp[i, k]),
                    clock_event_reasons=int(reasons[i, k]),
                    xid=int(xid[i, k]),
                    ecc_dbe=int(ecc[i, k]),
                    nvlink_errors=int(link_err[i, k]),
                )
                for i in range(n)
                for k in range(g)
            ]
            t += step
