"""What the stream workers' cross-rank stage tells their temporal stage (``argus.step-findings``,
keyed by job): one :class:`StepFindings` per complete step, and the :class:`JobOrder` a
worker's timer sends there about a job (timers may not write the stage's tables).

The cross-rank detectors make these (:func:`detectors.step_findings`) and the temporal
stage reads them (:func:`detectors.apply_findings`); they live here, with the other record
types, because they travel on a topic: one definition, its Avro schema
(``avro/step_findings.v*.avsc``) and its range checks (:func:`schemas.validate`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ._records import EvidenceRecord, Record, StepSummary

__all__ = ["Finding", "JobOrder", "StepFindings"]


@dataclass(frozen=True)
class Finding(EvidenceRecord):
    """One suspect of one step (a nested record of :class:`StepFindings`).

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


@dataclass(frozen=True, eq=False)
class StepFindings(Record):
    """The stateless, cross-rank half of one step's diagnosis: the job's step time, its
    reference level of every metric (``job_median``: the typical rank's work, the fastest
    ranks' collectives, in the detectors' ``METRICS`` order) and its step without the wait
    for the slowest rank (``job_ms``) for the iteration level, the rank/stage findings, the
    weakly flagged ranks (hysteresis), the step summary (the temporal stage sends it once
    the step is diagnosed), and for the first three ranks of each rank, link or host finding
    a few healthy peers of its group (``peers``: whom the kernel level compares it with)."""

    job: str
    run: int
    step: int
    end_ns: int
    n_ranks: int
    step_ms: float
    job_median: np.ndarray
    findings: tuple[Finding, ...]
    summary: StepSummary
    weak: tuple[int, ...] = ()
    job_ms: float = -1.0
    peers: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def to_avro(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "run": self.run,
            "step": self.step,
            "end_ns": self.end_ns,
            "n_ranks": self.n_ranks,
            "step_ms": self.step_ms,
            "job_median": np.asarray(self.job_median, dtype=float).tolist(),
            "findings": [f.to_avro() for f in self.findings],
            "summary": self.summary.to_avro(),
            "weak": list(self.weak),
            "job_ms": self.job_ms,
            "peer_ranks": list(self.peers),
            "peers": [list(p) for p in self.peers.values()],
        }

    @classmethod
    def from_avro(cls, data: Mapping[str, Any]) -> StepFindings:
        return cls(
            job=data["job"],
            run=data["run"],
            step=data["step"],
            end_ns=data["end_ns"],
            n_ranks=data["n_ranks"],
            step_ms=data["step_ms"],
            job_median=np.asarray(data["job_median"], dtype=float),
            findings=tuple(Finding.from_avro(f) for f in data["findings"]),
            summary=StepSummary.from_avro(data["summary"]),  # type: ignore[arg-type]
            weak=tuple(data["weak"]),
            job_ms=data["job_ms"],
            peers=dict(zip(data["peer_ranks"], map(tuple, data["peers"]), strict=True)),
        )


@dataclass(frozen=True, slots=True)
class JobOrder(Record):
    """An order about one job run from a worker's timer to its temporal stage, sent on the
    step-findings topic keyed by job (so it is applied in order with the job's steps, where
    the job's table rows may be written): ``expire`` forgets a run silent for the job TTL;
    ``release`` diagnoses the steps it holds that waited long enough (no later step came)."""

    job: str
    run: int
    action: str

    ACTIONS: ClassVar[frozenset[str]] = frozenset({"expire", "release"})
