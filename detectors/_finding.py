"""A finding: one suspect with its cause, evidence and cost, before it becomes an Anomaly."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Finding", "anomaly_id"]


@dataclass(frozen=True)
class Finding:
    """One suspect of one step.

    ``suspect`` is named ``rank:<r>``, ``<hostA><-><hostB>`` (link), ``<host>``,
    ``<group column>:<key>`` (a stage), ``dp`` (the data-parallel replicas), ``pipeline``,
    ``job`` or ``checkpoint``; ``evidence`` holds the figures that decided (the deciding
    one is named by ``decided_by``); ``step_ms_added`` is what the suspect adds to the
    job's step time (what-if: the suspect at its group's median).
    """

    cause: str
    level: str
    suspect_kind: str
    suspect: str
    ranks: tuple[int, ...]
    score: float
    decided_by: str
    evidence: Mapping[str, float] = field(default_factory=dict)
    step_ms_added: float = 0.0

    @property
    def key(self) -> str:
        """Identity across steps: cause and suspect."""
        return f"{self.cause}|{self.suspect}"


def anomaly_id(job: str, run: int, cause: str, suspect: str, onset: int) -> str:
    """Deterministic anomaly id: a hash of job, run, cause, suspect and onset step (a replay
    gives the same ids, so downstream keeps each once)."""
    return hashlib.sha1(f"{job}|{run}|{cause}|{suspect}|{onset}".encode()).hexdigest()[:20]
