"""Topic names and the keys that give partition locality."""

from __future__ import annotations

__all__ = [
    "ALL_TOPICS",
    "ANOMALIES",
    "DEAD_LETTER",
    "DEEPEN_EVIDENCE",
    "GPU_SAMPLES",
    "HEARTBEATS",
    "KERNELS",
    "STACKS",
    "STEPS",
    "STEP_FINDINGS",
    "STEP_SUMMARIES",
    "TOPIC_SCHEMAS",
    "job_key",
    "rank_key",
    "step_key",
]

STEPS = "argus.steps"
"""StepBatch, keyed by job and step: every rank of a step meets in one worker."""
KERNELS = "argus.kernels"
"""KernelSketch and KernelNames, keyed by job and rank: a rank's delta chain stays in order."""
STACKS = "argus.stacks"
"""StackSample, keyed by job and rank."""
GPU_SAMPLES = "argus.gpu"
"""GpuSample from the node agent, keyed by host."""
HEARTBEATS = "argus.heartbeats"
"""Heartbeat (one rank) and HeartbeatBatch (a node's ranks, from the relay), keyed by job:
the hang detector sees all ranks of a job."""
STEP_FINDINGS = "argus.step-findings"
"""Internal to the stream workers: StepFindings (one step's cross-rank findings, from the
cross-rank stage) and JobOrder (from a worker's timer), keyed by job: the temporal stage."""
DEEPEN_EVIDENCE = "argus.deepen-evidence"
"""Internal to the stream workers: kernel sketches, names and stack samples as the ranks
sent them, re-keyed by job and packed many to a message (``streams.deepening.pack``: not a
record of its own, so in no ``TOPIC_SCHEMAS`` entry), co-partitioned with
``argus.step-findings``: a job's evidence meets its diagnosis in one worker."""
STEP_SUMMARIES = "argus.step-summaries"
"""StepSummary, keyed by job: the temporal stage."""
ANOMALIES = "argus.anomalies"
"""Anomaly, keyed by job."""
DEAD_LETTER = "argus.dead-letter"
"""DeadLetter: bad input with the reason, never dropped silently."""

ALL_TOPICS = (STEPS, KERNELS, STACKS, GPU_SAMPLES, HEARTBEATS, STEP_SUMMARIES, ANOMALIES, DEAD_LETTER)

TOPIC_SCHEMAS: dict[str, frozenset[str]] = {
    STEPS: frozenset({"step_batch"}),
    KERNELS: frozenset({"kernel_sketch", "kernel_names"}),
    STACKS: frozenset({"stack_sample"}),
    GPU_SAMPLES: frozenset({"gpu_sample"}),
    HEARTBEATS: frozenset({"heartbeat", "heartbeat_batch"}),
    STEP_FINDINGS: frozenset({"step_findings", "job_order"}),
    STEP_SUMMARIES: frozenset({"step_summary"}),
    ANOMALIES: frozenset({"anomaly"}),
    DEAD_LETTER: frozenset({"dead_letter"}),
}
"""The records each topic carries, by schema name (``SCHEMAS[id].name``); a record of any
other schema on a topic is forged or misrouted and is dead-lettered, never stored: every
rank may write ``argus.steps``, only the stream workers ``argus.anomalies``
(docs/operations.md, "Who writes which topic")."""


def step_key(job: str, step: int) -> bytes:
    """Key of everything about one step of one job (cross-rank stage)."""
    return f"{job}/{step}".encode()


def rank_key(job: str, rank: int) -> bytes:
    """Key of a rank's ordered streams (kernel sketches, stacks)."""
    return f"{job}/r{rank}".encode()


def job_key(job: str) -> bytes:
    """Key of the temporal stage and of anomalies."""
    return job.encode()
