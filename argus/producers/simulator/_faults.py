"""Faults the simulator injects, and the ground-truth labels it reports for them.

Fault kinds are the root-cause class strings of ``detectors`` (producers may not import
detectors, so they are spelled here too; a test checks both lists agree).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._layout import Layout

__all__ = [
    "CHECKPOINT_STALL",
    "COMPUTE_STRAGGLER",
    "DATALOADER_STALL",
    "FAULT_KINDS",
    "GC_PAUSE",
    "HOST_CPU_CONTENTION",
    "JIT_COMPILE_STALL",
    "LINK_DEGRADATION",
    "MASKED_COMPUTE_STRAGGLER",
    "ONE_OFF_KINDS",
    "PIPELINE_BUBBLE",
    "PIPELINE_STAGE_IMBALANCE",
    "SEQUENCE_LENGTH_IMBALANCE",
    "Fault",
    "Label",
    "random_fault",
]

from argus.schemas.causes import (
    CHECKPOINT_STALL,
    COMPUTE_STRAGGLER,
    DATALOADER_STALL,
    GC_PAUSE,
    HOST_CPU_CONTENTION,
    JIT_COMPILE_STALL,
    LINK_DEGRADATION,
    MASKED_COMPUTE_STRAGGLER,
    PIPELINE_BUBBLE,
    PIPELINE_STAGE_IMBALANCE,
    SEQUENCE_LENGTH_IMBALANCE,
)
from argus.schemas.causes import FAULT_CAUSES as FAULT_KINDS
from argus.schemas.causes import ONE_OFF_CAUSES as ONE_OFF_KINDS


@dataclass(frozen=True)
class Fault:
    """One injected fault, active on steps ``first_step .. first_step + steps - 1``.

    ``ranks`` are the culprit ranks (compute/masked straggler, JIT, data-loader, GC and
    checkpoint stalls: any ranks; link degradation: the two ranks at the ends of the slow
    ring edge); ``host`` the contended host index; ``stage`` the overloaded pp stage.
    ``magnitude`` is kind-specific: a slowdown factor (stragglers, link, bubble, stage,
    sequence length, checkpoint) or the stall in ms (JIT, data loader, GC); 0 picks the
    default. A checkpoint stall acts on the checkpoint steps inside its window only.
    ``every``: a flapping fault acts on every ``every``-th step of its window only;
    ``ramp``: a drift, whose slowdown factor grows linearly from 1 to ``magnitude`` over
    the window. A compute straggler given a ``host`` and no ranks slows every rank of it.
    Host CPU contention with a ``magnitude`` also starves the host's data loaders: that
    many ms more data-loader wait per step on each of its ranks. ``kernel``: for a compute straggler, only the kernels whose
    name contains it run ``magnitude`` times slower (``"gemm"``: a throttled GPU's matrix
    multiplies), the step as much slower as those kernels' share of it.
    """

    kind: str
    first_step: int
    steps: int = 1
    ranks: tuple[int, ...] = ()
    host: int | None = None
    stage: int | None = None
    magnitude: float = 0.0
    every: int = 1
    ramp: bool = False
    kernel: str = ""

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}")
        if self.steps < 1 or self.first_step < 0 or self.every < 1:
            raise ValueError("a fault needs first_step >= 0, steps >= 1 and every >= 1")
        if self.kernel and self.kind != COMPUTE_STRAGGLER:
            raise ValueError("only a compute straggler slows chosen kernels")

    def active(self, step: int) -> bool:
        """Whether the fault acts on ``step``."""
        return (
            self.first_step <= step < self.first_step + self.steps
            and (step - self.first_step) % self.every == 0
        )

    @property
    def last_step(self) -> int:
        """The last step the fault acts on."""
        return self.first_step + (self.steps - 1) // self.every * self.every

    def magnitude_at(self, step: int) -> float:
        """The magnitude on ``step`` (a drift's factor grows from 1 to ``magnitude``)."""
        if not self.ramp or not self.magnitude:
            return self.magnitude
        frac = min(max((step - self.first_step + 1) / self.steps, 0.0), 1.0)
        return 1.0 + (self.magnitude - 1.0) * frac

    def noticeable_from(self, rise: float = 0.05) -> int:
        """The first step a drift's slowdown reaches ``rise`` (its label's onset)."""
        if not self.ramp or self.magnitude <= 1.0 + rise:
            return self.first_step
        return self.first_step + int(np.ceil(rise / (self.magnitude - 1.0) * self.steps)) - 1


@dataclass(frozen=True)
class Label:
    """Ground truth of one injected fault, named the way the detectors name suspects.

    ``suspect`` is ``rank:<r>`` (one culprit rank; several culprit ranks give one label
    each), ``<hostA><-><hostB>`` (a link), ``<host>`` (a host), ``pp:<s>`` (a stage),
    ``dp`` (the data-parallel replicas) or ``pipeline``. ``ranks`` are the culprit ranks
    (empty for job-, stage- and replica-level faults). ``kernel`` is what the kernel level
    should name, where the fault has one cause there: a kernel family (``gemm``,
    ``nccl:AllReduce``) or a word of the frame (``dataloader``); empty otherwise.
    """

    kind: str
    first_step: int
    last_step: int
    suspect_kind: str
    suspect: str
    ranks: tuple[int, ...] = ()
    kernel: str = ""


def random_fault(kind: str, layout: Layout, rng: np.random.Generator, first_step: int) -> Fault:
    """A fault of ``kind`` on random culprits with a realistic random magnitude.

    Persistent kinds last 12..30 steps, one-off stalls one step (a checkpoint stall
    waits for the next checkpoint step in the simulator).
    """
    n = layout.n_ranks
    steps = int(rng.integers(12, 31))
    rank = int(rng.integers(0, n))
    if kind == COMPUTE_STRAGGLER:
        return Fault(kind, first_step, steps, (rank,), magnitude=float(rng.uniform(1.2, 1.8)))
    if kind == MASKED_COMPUTE_STRAGGLER:
        return Fault(kind, first_step, steps, (rank,), magnitude=float(rng.uniform(1.2, 1.8)))
    if kind == LINK_DEGRADATION:
        c = layout.coords
        if layout.dp < 2 or layout.tp * layout.cp < layout.gpus_per_host:
            other = (rank + layout.gpus_per_host) % n
        else:  # the next dp replica's same-position rank: an inter-host ring edge
            other = layout.rank_at(
                pp=int(c["pp"][rank]),
                dp=(int(c["dp"][rank]) + 1) % layout.dp,
                tp=int(c["tp"][rank]),
                cp=int(c["cp"][rank]),
            )
        return Fault(kind, first_step, steps, (rank, other), magnitude=float(rng.uniform(2.0, 4.0)))
    if kind == PIPELINE_BUBBLE:
        return Fault(kind, first_step, steps, magnitude=float(rng.uniform(1.6, 2.5)))
    if kind == PIPELINE_STAGE_IMBALANCE:
        stage = int(rng.integers(0, layout.pp))
        return Fault(kind, first_step, steps, stage=stage, magnitude=float(rng.uniform(1.25, 1.6)))
    if kind == SEQUENCE_LENGTH_IMBALANCE:
        return Fault(kind, first_step, steps, magnitude=float(rng.uniform(1.4, 2.0)))
    if kind == HOST_CPU_CONTENTION:
        return Fault(kind, first_step, steps, host=int(rng.integers(0, layout.n_hosts)))
    if kind == JIT_COMPILE_STALL:
        return Fault(kind, first_step, 1, (rank,), magnitude=float(rng.uniform(500.0, 4000.0)))
    if kind == DATALOADER_STALL:
        return Fault(kind, first_step, 1, (rank,), magnitude=float(rng.uniform(200.0, 2000.0)))
    if kind == GC_PAUSE:
        return Fault(kind, first_step, 1, (rank,), magnitude=float(rng.uniform(150.0, 1200.0)))
    if kind == CHECKPOINT_STALL:
        return Fault(kind, first_step, 1, (rank,), magnitude=float(rng.uniform(2.5, 6.0)))
    raise ValueError(f"unknown fault kind {kind!r}")
