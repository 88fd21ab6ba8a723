"""Root-cause classes: the vocabulary of ``Anomaly.cause`` (docs/architecture.md#engine), shared by the
simulator's faults and the detectors' findings."""

from __future__ import annotations

__all__ = [
    "CHECKPOINT_STALL",
    "COMPUTE_STRAGGLER",
    "DATALOADER_STALL",
    "FAULT_CAUSES",
    "GC_PAUSE",
    "HANG",
    "HANG_CAUSES",
    "HOST_CPU_CONTENTION",
    "JIT_COMPILE_STALL",
    "LINK_DEGRADATION",
    "LOST_RANK",
    "MASKED_COMPUTE_STRAGGLER",
    "ONE_OFF_CAUSES",
    "PIPELINE_BUBBLE",
    "PIPELINE_STAGE_IMBALANCE",
    "SEQUENCE_LENGTH_IMBALANCE",
    "UNKNOWN",
]

COMPUTE_STRAGGLER = "compute_straggler"
LINK_DEGRADATION = "link_degradation"
PIPELINE_BUBBLE = "pipeline_bubble"
JIT_COMPILE_STALL = "jit_compile_stall"
MASKED_COMPUTE_STRAGGLER = "masked_compute_straggler"
PIPELINE_STAGE_IMBALANCE = "pipeline_stage_imbalance"
SEQUENCE_LENGTH_IMBALANCE = "sequence_length_imbalance"
DATALOADER_STALL = "dataloader_stall"
HOST_CPU_CONTENTION = "host_cpu_contention"
GC_PAUSE = "gc_pause"
CHECKPOINT_STALL = "checkpoint_stall"
UNKNOWN = "unknown"
HANG = "hang"
"""A rank (or a group) that never enters the collective its peers wait in (level "hang")."""
LOST_RANK = "lost_rank"
"""A rank or a host whose heartbeats stopped while the job stalls (level "hang")."""

FAULT_CAUSES: tuple[str, ...] = (
    COMPUTE_STRAGGLER,
    LINK_DEGRADATION,
    PIPELINE_BUBBLE,
    JIT_COMPILE_STALL,
    MASKED_COMPUTE_STRAGGLER,
    PIPELINE_STAGE_IMBALANCE,
    SEQUENCE_LENGTH_IMBALANCE,
    DATALOADER_STALL,
    HOST_CPU_CONTENTION,
    GC_PAUSE,
    CHECKPOINT_STALL,
)
"""The slow-step causes (each a simulator fault kind and a detector class)."""
HANG_CAUSES: tuple[str, ...] = (HANG, LOST_RANK)
ONE_OFF_CAUSES = frozenset({JIT_COMPILE_STALL, DATALOADER_STALL, GC_PAUSE, CHECKPOINT_STALL})
"""Causes that hit one step (or a few): confirmed on the first step they are seen."""
