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

__all__ = ["Finding", "JobOrder", "RankResiduals", "StepFindings"]


def _runs(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a``'s runs of equal values: (values, lengths); a layout column is a few runs."""
    if not len(a):
        return a[:0], np.zeros(0, np.int32)
    starts = np.concatenate(([0], np.flatnonzero(a[1:] != a[:-1]) + 1))
    return a[starts], np.diff(np.concatenate((starts, [len(a)]))).astype(np.int32)


def _unruns(values: np.ndarray, lengths: bytes, n: int, name: str) -> np.ndarray:
    counts = np.frombuffer(lengths, "<i4")
    if len(counts) != len(values) or int(counts.min(initial=0)) < 0 or int(counts.sum()) != n:
        raise ValueError(f"residuals: the runs of {name} do not cover the {n} ranks")
    return np.repeat(values, counts)


def _f16_dev(lw: np.ndarray) -> tuple[float, np.ndarray]:
    """``lw`` as its median and its deviations from it in float16 (a 2e-4 log step)."""
    mid = float(np.median(lw)) if len(lw) else 0.0
    return mid, (lw - mid).astype(np.float16)


@dataclass(frozen=True, eq=False)
class RankResiduals:
    """One step's ranks for the change points (a nested record of :class:`StepFindings`):
    ``ranks`` (n,), ``lw`` the log of each rank's own work (ms; its median plus a float16
    deviation, :meth:`quantized`: what travels is what is tested), each rank's ``phase``
    that stands out most over the job's typical rank's (an index into the detectors'
    own-work phases), ``work_ms`` its group's fast side's own work (ms, for costs), and the
    layout columns the references and the grouping use (``hosts``, ``dp``, ``group``);
    ``replicas``: the dp replicas are references; ``untimed``: the records hold a step time
    only (a log). What a rank's residual is measured from depends on the ranks' baselines:
    :func:`detectors.changepoint.residuals`."""

    ranks: np.ndarray
    lw: np.ndarray
    phase: np.ndarray
    work_ms: float
    hosts: np.ndarray
    dp: np.ndarray
    group: np.ndarray
    replicas: bool = False
    untimed: bool = False

    @staticmethod
    def quantized(lw: np.ndarray) -> np.ndarray:
        """``lw`` as it travels: its median plus float16 deviations."""
        mid, dev = _f16_dev(lw)
        return mid + dev.astype(float)

    def to_avro(self) -> dict[str, Any]:
        mid, dev = _f16_dev(np.asarray(self.lw, float))
        hosts, host_runs = _runs(np.asarray(self.hosts).astype(str))
        dp, dp_runs = _runs(np.asarray(self.dp, np.int64))
        group, group_runs = _runs(np.asarray(self.group, np.int64))
        return {
            "ranks": np.asarray(self.ranks, "<i4").tobytes(),
            "lw_mid": mid,
            "lw_dev": dev.astype("<f2").tobytes(),
            "phase": np.asarray(self.phase, np.int8).tobytes(),
            "work_ms": self.work_ms,
            "hosts": hosts.tolist(),
            "host_runs": host_runs.astype("<i4").tobytes(),
            "dp": dp.astype("<i4").tobytes(),
            "dp_runs": dp_runs.astype("<i4").tobytes(),
            "group": group.astype("<i4").tobytes(),
            "group_runs": group_runs.astype("<i4").tobytes(),
            "replicas": self.replicas,
            "untimed": self.untimed,
        }

    @classmethod
    def from_avro(cls, data: Mapping[str, Any]) -> RankResiduals:
        ranks = np.frombuffer(data["ranks"], "<i4").astype(np.int64)
        n = len(ranks)
        dev = np.frombuffer(data["lw_dev"], "<f2")
        phase = np.frombuffer(data["phase"], np.int8)
        if len(dev) != n or len(phase) != n:
            raise ValueError(f"residuals: {n} ranks, {len(dev)} log works, {len(phase)} phases")
        dp = np.frombuffer(data["dp"], "<i4").astype(np.int64)
        group = np.frombuffer(data["group"], "<i4").astype(np.int64)
        return cls(
            ranks,
            float(data["lw_mid"]) + dev.astype(float),
            phase.copy(),
            float(data["work_ms"]),
            _unruns(np.asarray(data["hosts"], dtype=object), data["host_runs"], n, "hosts"),
            _unruns(dp, data["dp_runs"], n, "dp"),
            _unruns(group, data["group_runs"], n, "group"),
            bool(data["replicas"]),
            bool(data["untimed"]),
        )


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
    a few healthy peers of its group (``peers``: whom the kernel level compares it with);
    ``residuals``: every rank's own work for the change points (when they are on)."""

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
    residuals: RankResiduals | None = None

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
            "residuals": None if self.residuals is None else self.residuals.to_avro(),
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
            residuals=None if data.get("residuals") is None else RankResiduals.from_avro(data["residuals"]),
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
