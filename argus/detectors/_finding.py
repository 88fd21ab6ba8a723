"""A finding: one suspect with its cause, evidence and cost, before it becomes an Anomaly.

The type is :class:`schemas.Finding` (findings travel between the stream workers' stages
inside :class:`schemas.StepFindings`); the anomaly id that an episode of findings gets is
the detectors'.
"""

from __future__ import annotations

import hashlib

from argus.schemas import Finding

__all__ = ["Finding", "anomaly_id"]


def anomaly_id(job: str, run: int, cause: str, suspect: str, onset: int) -> str:
    """Deterministic anomaly id: a hash of job, run, cause, suspect and onset step (a replay
    gives the same ids, so downstream keeps each once)."""
    return hashlib.sha1(f"{job}|{run}|{cause}|{suspect}|{onset}".encode()).hexdigest()[:20]
