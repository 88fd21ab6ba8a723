"""Argus contracts: record types, Avro schemas, the wire codec, topic names, and how parts
of a step merge into the whole (:class:`PartMerger`, shared by the node relay and the worker).

Nothing here does I/O; producers, streams and sinks all speak these types.
"""

from __future__ import annotations

from ._codec import SCHEMAS, SchemaInfo, StepRowWriter, decode, decode_many, encode, peek_schema_id
from ._errors import DecodeError, SchemaError, UnknownSchemaError, ValidationError
from ._findings import Finding, JobOrder, RankResiduals, StepFindings
from ._heartbeats import HEARTBEAT_COLUMNS, HeartbeatBatch
from ._kernels import KernelStats
from ._parts import JobRun, PartGroup, PartMerger, dense_world
from ._records import (
    COLLECTIVE_COLUMNS,
    PHASE_COLUMNS,
    STEP_COLUMNS,
    Anomaly,
    DeadLetter,
    GpuSample,
    Heartbeat,
    KernelNames,
    KernelSketch,
    Record,
    StackSample,
    StepBatch,
    StepRecord,
    StepSummary,
)
from ._topics import (
    ALL_TOPICS,
    ANOMALIES,
    DEAD_LETTER,
    DEEPEN_EVIDENCE,
    GPU_SAMPLES,
    HEARTBEATS,
    KERNELS,
    STACKS,
    STEP_FINDINGS,
    STEP_SUMMARIES,
    STEPS,
    TOPIC_SCHEMAS,
    job_key,
    rank_key,
    step_key,
)
from ._validate import LIMITS, valid_steps, validate

__all__ = [
    "ALL_TOPICS",
    "ANOMALIES",
    "COLLECTIVE_COLUMNS",
    "DEAD_LETTER",
    "DEEPEN_EVIDENCE",
    "GPU_SAMPLES",
    "HEARTBEATS",
    "HEARTBEAT_COLUMNS",
    "KERNELS",
    "LIMITS",
    "PHASE_COLUMNS",
    "SCHEMAS",
    "STACKS",
    "STEPS",
    "STEP_COLUMNS",
    "STEP_FINDINGS",
    "STEP_SUMMARIES",
    "TOPIC_SCHEMAS",
    "Anomaly",
    "DeadLetter",
    "DecodeError",
    "Finding",
    "GpuSample",
    "Heartbeat",
    "HeartbeatBatch",
    "JobOrder",
    "JobRun",
    "KernelNames",
    "KernelSketch",
    "KernelStats",
    "PartGroup",
    "PartMerger",
    "RankResiduals",
    "Record",
    "SchemaError",
    "SchemaInfo",
    "StackSample",
    "StepBatch",
    "StepFindings",
    "StepRecord",
    "StepRowWriter",
    "StepSummary",
    "UnknownSchemaError",
    "ValidationError",
    "decode",
    "decode_many",
    "dense_world",
    "encode",
    "job_key",
    "peek_schema_id",
    "rank_key",
    "step_key",
    "valid_steps",
    "validate",
]
