"""The fault-injection cluster simulator: a synthetic job of up to 100,000+ ranks that emits
the records the real agent sends (step batches, kernel statistics, stack samples,
heartbeats) plus the ground truth of every injected fault, deterministically from a seed.

Typical use::

    sim = ClusterSimulator(Layout(dp=16, tp=8, pp=8), seed=1,
                           faults=[Fault(COMPUTE_STRAGGLER, first_step=20, steps=15, ranks=(17,))])
    for s in sim.run(60):
        s.batch                    # schemas.StepBatch, one entry per rank
        s.kernel_stats([17, 18])   # schemas.KernelStats per rank
        s.stacks([17])             # schemas.StackSample per rank
    sim.labels                     # ground truth

Hangs (heartbeats over wall time, :class:`HangSimulator`)::

    hs = HangSimulator(Layout(dp=16, tp=8, pp=8), HangScenario("collective_hang"), seed=1)
    for now_ns, beats in hs.ticks(1.0, 80.0): ...
    hs.labels
"""

from __future__ import annotations

from ._cluster import ClusterSimulator, PhaseTimes, SimStep
from ._faults import (
    CHECKPOINT_STALL,
    COMPUTE_STRAGGLER,
    DATALOADER_STALL,
    FAULT_KINDS,
    GC_PAUSE,
    HOST_CPU_CONTENTION,
    JIT_COMPILE_STALL,
    LINK_DEGRADATION,
    MASKED_COMPUTE_STRAGGLER,
    ONE_OFF_KINDS,
    PIPELINE_BUBBLE,
    PIPELINE_STAGE_IMBALANCE,
    SEQUENCE_LENGTH_IMBALANCE,
    Fault,
    Label,
    random_fault,
)
from ._fleet import BAD_NODE_KINDS, THROTTLE_REASONS, BadNode, FleetJob, FleetSimulator
from ._hangs import HANG_LOST, HANG_SCENARIOS, HangLabel, HangScenario, HangSimulator
from ._kernels import KERNEL_NAMES, kernel_names
from ._layout import Layout
from ._noise import CLEAN, REALISTIC, Noise
from ._space import PATHS, SHAPES, WHO, Background, SpaceFault, SpaceJob, SpaceLog, draw_job
from ._stacks import STACKS

__all__ = [
    "BAD_NODE_KINDS",
    "CHECKPOINT_STALL",
    "CLEAN",
    "COMPUTE_STRAGGLER",
    "DATALOADER_STALL",
    "FAULT_KINDS",
    "GC_PAUSE",
    "HANG_LOST",
    "HANG_SCENARIOS",
    "HOST_CPU_CONTENTION",
    "JIT_COMPILE_STALL",
    "KERNEL_NAMES",
    "LINK_DEGRADATION",
    "MASKED_COMPUTE_STRAGGLER",
    "ONE_OFF_KINDS",
    "PATHS",
    "PIPELINE_BUBBLE",
    "PIPELINE_STAGE_IMBALANCE",
    "REALISTIC",
    "SEQUENCE_LENGTH_IMBALANCE",
    "SHAPES",
    "STACKS",
    "THROTTLE_REASONS",
    "WHO",
    "Background",
    "BadNode",
    "ClusterSimulator",
    "Fault",
    "FleetJob",
    "FleetSimulator",
    "HangLabel",
    "HangScenario",
    "HangSimulator",
    "Label",
    "Layout",
    "Noise",
    "PhaseTimes",
    "SimStep",
    "SpaceFault",
    "SpaceJob",
    "SpaceLog",
    "draw_job",
    "kernel_names",
    "random_fault",
]
