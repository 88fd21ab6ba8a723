"""Decoded records → Arrow tables shaped like the ClickHouse tables (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from argus.schemas import (
    COLLECTIVE_COLUMNS,
    PHASE_COLUMNS,
    Anomaly,
    DeadLetter,
    GpuSample,
    KernelNames,
    KernelSketch,
    StackSample,
    StepBatch,
    StepSummary,
)

__all__ = ["TABLE_OF", "to_arrow"]

TABLE_OF: dict[type, str] = {
    StepBatch: "steps",
    KernelSketch: "kernel_sketches",
    KernelNames: "kernel_names",
    StackSample: "stacks",
    GpuSample: "gpu_samples",
    StepSummary: "step_summaries",
    Anomaly: "anomalies",
    DeadLetter: "dead_letters",
}
"""The table each record type lands in (Heartbeats are state, not rows)."""

_MS = pa.timestamp("ms")


def _ns_to_ms(ns: Any) -> pa.Array:
    return pa.array(np.asarray(ns, dtype=np.int64) // 1_000_000, type=_MS)


def _steps(batches: Sequence[StepBatch]) -> pa.Table:
    def cat(name: str) -> np.ndarray:
        return np.concatenate([b[name] for b in batches])

    sizes = [len(b) for b in batches]
    start, end = cat("start_ns"), cat("end_ns")
    cols: dict[str, Any] = {
        "job": pa.array(np.repeat([b.job for b in batches], sizes).astype(object), pa.string()),
        "run": pa.array(np.repeat([b.run for b in batches], sizes), pa.uint32()),
        "step": pa.array(np.repeat([b.step for b in batches], sizes), pa.uint64()),
        "rank": pa.array(cat("rank"), pa.uint32()),
        "host": pa.array(cat("host"), pa.string()),
        "gpu_uuid": pa.array(cat("gpu_uuid"), pa.string()),
    }
    for name in ("dp", "tp", "pp", "ep", "cp"):
        cols[name] = pa.array(cat(name), pa.uint32())
    cols["time"] = _ns_to_ms(end)
    cols["start_ns"] = pa.array(start, pa.int64())
    cols["end_ns"] = pa.array(end, pa.int64())
    cols["step_ms"] = pa.array((end - start) / 1e6, pa.float32())
    for name in PHASE_COLUMNS + COLLECTIVE_COLUMNS:
        cols[name] = pa.array(cat(name), pa.float32())
    cols["samples"] = pa.array(cat("samples"), pa.uint64())
    cols["tokens"] = pa.array(cat("tokens"), pa.uint64())
    return pa.table(cols)


def _kernel_sketches(recs: Sequence[KernelSketch]) -> pa.Table:
    return pa.table(
        {
            "job": pa.array([r.job for r in recs], pa.string()),
            "run": pa.array([r.run for r in recs], pa.uint32()),
            "rank": pa.array([r.rank for r in recs], pa.uint32()),
            "step": pa.array([r.step for r in recs], pa.uint64()),
            # Kernel sketches carry no wall clock: they land with the sink's receive time.
            "codec": pa.array([r.codec for r in recs], pa.uint16()),
            "base_step": pa.array([r.base_step for r in recs], pa.int64()),
            "payload": pa.array([r.payload for r in recs], pa.binary()),
        }
    )


def _kernel_names(recs: Sequence[KernelNames]) -> pa.Table:
    sizes = [len(r.ids) for r in recs]
    return pa.table(
        {
            "job": pa.array(np.repeat([r.job for r in recs], sizes).astype(object), pa.string()),
            "run": pa.array(np.repeat([r.run for r in recs], sizes), pa.uint32()),
            "rank": pa.array(np.repeat([r.rank for r in recs], sizes), pa.uint32()),
            "kernel_id": pa.array([i for r in recs for i in r.ids], pa.uint32()),
            "name": pa.array([n for r in recs for n in r.names], pa.string()),
        }
    )


def _stacks(recs: Sequence[StackSample]) -> pa.Table:
    sizes = [len(r.stacks) for r in recs]

    def rep(values: list[Any], typ: pa.DataType) -> pa.Array:
        return pa.array(np.repeat(np.array(values, dtype=object), sizes).tolist(), typ)

    return pa.table(
        {
            "job": rep([r.job for r in recs], pa.string()),
            "run": rep([r.run for r in recs], pa.uint32()),
            "rank": rep([r.rank for r in recs], pa.uint32()),
            "step": rep([r.step for r in recs], pa.uint64()),
            "time": _ns_to_ms(np.repeat([r.end_ns for r in recs], sizes)),
            "stack": pa.array([s for r in recs for s in r.stacks], pa.string()),
            "count": pa.array([c for r in recs for c in r.counts], pa.uint32()),
        }
    )


_GPU_TYPES: dict[str, pa.DataType] = {
    "host": pa.string(),
    "gpu_uuid": pa.string(),
    "gpu_index": pa.uint16(),
    "gpu_util": pa.float32(),
    "sm_clock_mhz": pa.float32(),
    "power_w": pa.float32(),
    "temp_c": pa.float32(),
    "clock_event_reasons": pa.uint64(),
    "xid": pa.uint32(),
    "ecc_dbe": pa.uint64(),
    "remapped_rows": pa.uint64(),
    "nvlink_tx_bytes": pa.uint64(),
    "nvlink_rx_bytes": pa.uint64(),
    "nvlink_errors": pa.uint64(),
}


def _gpu_samples(recs: Sequence[GpuSample]) -> pa.Table:
    # Typed like the columns, so a value out of a column's range raises here instead of
    # wrapping around in the store (validation keeps them in range).
    cols: dict[str, Any] = {}
    for name, typ in _GPU_TYPES.items():
        cols[name] = pa.array([getattr(r, name) for r in recs], typ)
        if name == "gpu_index":
            cols["time"] = _ns_to_ms([r.time_ns for r in recs])
    return pa.table(cols)


def _step_summaries(recs: Sequence[StepSummary]) -> pa.Table:
    cols: dict[str, Any] = {
        "job": pa.array([r.job for r in recs], pa.string()),
        "run": pa.array([r.run for r in recs], pa.uint32()),
        "step": pa.array([r.step for r in recs], pa.uint64()),
        "time": _ns_to_ms([r.end_ns for r in recs]),
        "ranks": pa.array([r.ranks for r in recs], pa.uint32()),
        "missing": pa.array([list(r.missing) for r in recs], pa.list_(pa.uint32())),
    }
    cols.update(
        {name: pa.array([getattr(r, name) for r in recs], pa.float32()) for name in StepSummary.FIGURES}
    )
    cols["tokens"] = pa.array([r.tokens for r in recs], pa.uint64())
    cols["suspects"] = pa.array([list(r.suspects) for r in recs], pa.list_(pa.uint32()))
    return pa.table(cols)


def _anomalies(recs: Sequence[Anomaly]) -> pa.Table:
    return pa.table(
        {
            "id": [r.id for r in recs],
            "job": [r.job for r in recs],
            "run": pa.array([r.run for r in recs], pa.uint32()),
            "start_step": pa.array([r.start_step for r in recs], pa.uint64()),
            "end_step": pa.array([r.end_step for r in recs], pa.uint64()),
            "level": [r.level for r in recs],
            "suspect_kind": [r.suspect_kind for r in recs],
            "suspect": [r.suspect for r in recs],
            "ranks": pa.array([list(r.ranks) for r in recs], pa.list_(pa.uint32())),
            "cause": [r.cause for r in recs],
            "score": pa.array([r.score for r in recs], pa.float64()),
            "evidence": pa.array(
                [list(r.evidence.items()) for r in recs], pa.map_(pa.string(), pa.float64())
            ),
            "summary": [r.summary for r in recs],
            "step_ms_added": pa.array([r.step_ms_added for r in recs], pa.float64()),
            "gpu_hours_lost": pa.array([r.gpu_hours_lost for r in recs], pa.float64()),
            "time": _ns_to_ms([r.detected_ns for r in recs]),
            "severity": [r.severity for r in recs],
        }
    )


def _dead_letters(recs: Sequence[DeadLetter]) -> pa.Table:
    return pa.table(
        {
            "topic": [r.topic for r in recs],
            "partition": pa.array([r.partition for r in recs], pa.uint32()),
            "offset": pa.array([r.offset for r in recs], pa.uint64()),
            "reason": [r.reason for r in recs],
            "error": [r.error for r in recs],
            "time": _ns_to_ms([r.time_ns for r in recs]),
            "payload": pa.array([r.payload for r in recs], pa.binary()),
        }
    )


_CONVERTERS: dict[type, Callable[[Any], pa.Table]] = {
    StepBatch: _steps,
    KernelSketch: _kernel_sketches,
    KernelNames: _kernel_names,
    StackSample: _stacks,
    GpuSample: _gpu_samples,
    StepSummary: _step_summaries,
    Anomaly: _anomalies,
    DeadLetter: _dead_letters,
}


def to_arrow(records: Sequence[Any]) -> tuple[str, pa.Table]:
    """The destination table and the rows of records that all have one type."""
    if not records:
        raise ValueError("to_arrow needs at least one record")
    kind = type(records[0])
    if any(type(r) is not kind for r in records):
        raise ValueError("to_arrow takes records of one type")
    return TABLE_OF[kind], _CONVERTERS[kind](records)
