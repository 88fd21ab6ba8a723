"""The causes the detectors decide (:mod:`argus.schemas.causes` defines their names, the
exact strings of docs/architecture.md#engine) and the figure that decides each."""

from __future__ import annotations

__all__ = ["DECIDING_FIGURE", "ROOT_CAUSES"]

from argus.schemas.causes import (
    CHECKPOINT_STALL,
    COMPUTE_STRAGGLER,
    DATALOADER_STALL,
    FAULT_CAUSES,
    GC_PAUSE,
    HOST_CPU_CONTENTION,
    JIT_COMPILE_STALL,
    LINK_DEGRADATION,
    MASKED_COMPUTE_STRAGGLER,
    PIPELINE_BUBBLE,
    PIPELINE_STAGE_IMBALANCE,
    SEQUENCE_LENGTH_IMBALANCE,
    UNKNOWN,
)

ROOT_CAUSES: tuple[str, ...] = (*FAULT_CAUSES, UNKNOWN)

DECIDING_FIGURE: dict[str, str] = {
    COMPUTE_STRAGGLER: "compute_ms_z",
    MASKED_COMPUTE_STRAGGLER: "collective_ms_z",
    LINK_DEGRADATION: "all_reduce_ms_z",
    PIPELINE_BUBBLE: "p2p_ms_rise",
    PIPELINE_STAGE_IMBALANCE: "stage_compute_ratio",
    SEQUENCE_LENGTH_IMBALANCE: "tokens_z",
    JIT_COMPILE_STALL: "compile_ms_z",
    DATALOADER_STALL: "dataloader_ms_z",
    HOST_CPU_CONTENTION: "host_flagged_ranks",
    GC_PAUSE: "gc_ms_z",
    CHECKPOINT_STALL: "checkpoint_ms_z",
}
"""Evidence key of the figure that decides each cause at rank/stage/job level as the
simulator injects it (a link on another collective kind is decided by that kind's
``<column>_z``; a job-wide cause found at iteration level by ``<column>_rise``)."""
