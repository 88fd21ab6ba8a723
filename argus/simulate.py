"""Publish a simulated job into Kafka, as a fleet of real agents would (``argus simulate``)."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from argus.producers.simulator import (
    FAULT_KINDS,
    ClusterSimulator,
    Fault,
    Label,
    Layout,
    SimStep,
    kernel_names,
)
from argus.producers.sketch import RankSketchEncoder
from argus.schemas import KERNELS, STACKS, STEPS, rank_key, step_key

from .config import ConfigError

__all__ = ["SimulationResult", "layout_for", "parse_fault", "publish_simulation"]

_FAULT = re.compile(r"^(?P<kind>[a-z_]+)@(?P<step>\d+)(?:\+(?P<steps>\d+))?(?::(?P<target>[\w=,.-]+))?$")


def layout_for(ranks: int, *, tp: int = 8, pp: int = 0) -> Layout:
    """A dp × tp × pp layout for ``ranks`` (pp 4 from 256 ranks up, else 2 or 1)."""
    if ranks < 8 or ranks % tp:
        raise ConfigError(f"--ranks must be a multiple of {tp} (8 GPUs per host), got {ranks}")
    if pp <= 0:
        pp = (
            4 if ranks >= 256 and ranks % (tp * 4) == 0 else 2 if ranks % (tp * 2) == 0 and ranks >= 32 else 1
        )
    if ranks % (tp * pp):
        raise ConfigError(f"--ranks {ranks} is not a multiple of tp × pp = {tp * pp}")
    return Layout(dp=ranks // (tp * pp), tp=tp, pp=pp)


def parse_fault(spec: str, layout: Layout) -> Fault:
    """``CLASS@STEP[+STEPS][:TARGET]``; TARGET is ranks (``17`` or ``17,18``), ``host=3`` or
    ``stage=1``, optionally followed by ``,x=1.3`` (the magnitude) and, for a compute
    straggler, ``,kernel=gemm`` (only those kernels slow: ``compute_straggler@20:17,kernel=gemm``).
    Without a target the culprit is rank n/3 (host n/24, stage pp-1)."""
    m = _FAULT.match(spec.strip())
    if not m:
        raise ConfigError(
            f"bad --fault {spec!r}: expected CLASS@STEP[+STEPS][:TARGET], e.g. compute_straggler@20:17"
        )
    kind = m["kind"]
    if kind not in FAULT_KINDS:
        raise ConfigError(f"unknown fault class {kind!r}; one of: {', '.join(sorted(FAULT_KINDS))}")
    step = int(m["step"])
    steps = int(m["steps"] or 15)
    n = layout.n_ranks
    ranks: tuple[int, ...] = (n // 3,)
    host: int | None = None
    stage: int | None = None
    target = m["target"] or ""
    magnitude, kernel = 0.0, ""
    try:
        parts = target.split(",")
        for opt in [p for p in parts if p.startswith(("x=", "kernel="))]:
            name, _, val = opt.partition("=")
            if name == "x":
                magnitude = float(val)
            else:
                kernel = val
        target = ",".join(p for p in parts if not p.startswith(("x=", "kernel=")))
        if target.startswith("host="):
            host = int(target[5:])
        elif target.startswith("stage="):
            stage = int(target[6:])
        elif target:
            ranks = tuple(int(r) for r in target.split(","))
    except ValueError:
        raise ConfigError(f"bad --fault target {target!r}") from None
    if any(not 0 <= r < n for r in ranks):
        raise ConfigError(f"--fault {spec!r}: rank outside 0..{n - 1}")
    if kind == "host_cpu_contention" and host is None:
        host = ranks[0] // layout.gpus_per_host
    if kind == "pipeline_stage_imbalance" and stage is None:
        stage = layout.pp - 1
    if kind == "link_degradation" and len(ranks) == 1:
        ranks = (ranks[0], (ranks[0] + layout.gpus_per_host) % n)
    try:
        return Fault(kind, step, steps, ranks, host=host, stage=stage, magnitude=magnitude, kernel=kernel)
    except ValueError as exc:
        raise ConfigError(f"bad --fault {spec!r}: {exc}") from None


@dataclass(frozen=True)
class SimulationResult:
    """What was published."""

    job: str
    steps: int
    records: int
    messages: int
    labels: tuple[Label, ...]
    seconds: float


def publish_simulation(
    publish: Callable[[str, bytes, Any], None],
    *,
    job: str,
    layout: Layout,
    steps: int,
    faults: Sequence[Fault] = (),
    seed: int = 0,
    rate: float = 0.0,
    ranks_per_message: int = 64,
    checkpoint_every: int = 0,
    progress: Callable[[int], None] | None = None,
    kernels: bool = False,
) -> SimulationResult:
    """Publish ``steps`` steps of a simulated job through ``publish(topic, key, record)``.

    Each step goes out as StepBatches of ``ranks_per_message`` ranks (a node agent's batch;
    one Kafka message each), at ``rate`` steps per second (0: as fast as possible); wall
    clocks are the machine's, so latencies measured downstream are real. With ``kernels``,
    every rank also publishes its kernel sketch (delta-coded, names once) and its stack
    sample every step, keyed by rank, as the agent does (``records`` counts them too).
    """
    if ranks_per_message < 1:
        raise ConfigError("ranks per message must be >= 1")
    sim = ClusterSimulator(
        layout, seed=seed, job=job, faults=faults, start_ns=time.time_ns(), checkpoint_every=checkpoint_every
    )
    began = time.monotonic()
    records = messages = 0
    encoders: dict[int, RankSketchEncoder] = {}
    for i, s in enumerate(sim.run(steps)):
        if rate > 0:
            wait = began + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        batch = s.batch
        shift = time.time_ns() - int(batch["end_ns"].max())  # the step ends now
        cols = dict(batch.columns)
        cols["start_ns"] = cols["start_ns"] + shift
        cols["end_ns"] = cols["end_ns"] + shift
        batch = type(batch)(batch.job, batch.run, batch.step, cols)
        key = step_key(job, batch.step)
        for lo in range(0, len(batch), ranks_per_message):
            publish(STEPS, key, batch.take(np.arange(lo, min(lo + ranks_per_message, len(batch)))))
            messages += 1
        records += len(batch)
        if kernels:
            records += _publish_kernels(publish, s, encoders, shift)
        if progress is not None:
            progress(1)
    return SimulationResult(job, steps, records, messages, tuple(sim.labels), time.monotonic() - began)


def _publish_kernels(
    publish: Callable[[str, bytes, Any], None], s: SimStep, encoders: dict[int, RankSketchEncoder], shift: int
) -> int:
    """Every rank's kernel sketch (its names first, once) and stack sample of one step."""
    b = s.batch
    ranks = b["rank"].tolist()
    for rank, stats in s.kernel_stats(ranks).items():
        key = rank_key(b.job, rank)
        enc = encoders.get(rank)
        if enc is None:
            enc = encoders[rank] = RankSketchEncoder(b.job, b.run, rank)
            publish(KERNELS, key, kernel_names(b.job, b.run, rank))
        publish(KERNELS, key, enc.encode(b.step, stats))
    for rank, sample in s.stacks(ranks).items():
        moved = dataclasses.replace(sample, start_ns=sample.start_ns + shift, end_ns=sample.end_ns + shift)
        publish(STACKS, rank_key(b.job, rank), moved)
    return 2 * len(ranks)
