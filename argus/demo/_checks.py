"""What the demo found, read back from ClickHouse, against what it injected."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from argus.producers.simulator import Label
from argus.producers.simulator.scoring import Scoring, match_faults

from ._config import DemoConfig, DemoError

__all__ = [
    "MIN_IOU",
    "TRAIN_ACCEPT",
    "DemoResult",
    "Finding",
    "JobCheck",
    "check_findings",
    "read_findings",
    "train_label",
]

TRAIN_ACCEPT: dict[str, frozenset[str]] = {"compute_straggler": frozenset({"masked_compute_straggler"})}
"""The real run's slowed rank is slower in forward while its peers wait for it in the
all-reduce: a compute straggler, or a masked one when the waiting dominates."""
MIN_IOU = 0.8
"""Every matched window must overlap its injected fault's by this much (docs/architecture.md#numbers)."""


@dataclass(frozen=True)
class Finding:
    """One anomaly as stored in ClickHouse (the latest version of its id)."""

    job: str
    start_step: int
    end_step: int
    suspect: str
    cause: str
    ranks: tuple[int, ...]
    score: float
    evidence: dict[str, float]
    step_ms_added: float
    gpu_hours_lost: float
    summary: str
    suspect_kind: str = "rank"
    severity: str = "page"


@dataclass(frozen=True)
class JobCheck:
    """One job's findings against what was injected into it (:func:`argus.producers.simulator.scoring.match_faults`)."""

    job: str
    labels: tuple[Label, ...]
    findings: tuple[Finding, ...]
    scoring: Scoring

    def ok(self, min_iou: float = MIN_IOU) -> bool:
        """Every fault found with its class, nothing else reported, every window IoU ≥ ``min_iou``."""
        return self.scoring.ok(min_iou)


def check_findings(
    findings: Sequence[Finding],
    labels: Mapping[str, Sequence[Label]],
    accept: Mapping[str, Mapping[str, Collection[str]]] | None = None,
) -> tuple[JobCheck, ...]:
    """Per job of ``labels``, its findings matched to its injected faults; ``accept`` gives,
    per job, other classes that count as right for a label kind (see ``match_faults``)."""
    out = []
    for job, labs in labels.items():
        mine = tuple(f for f in findings if f.job == job)
        scoring = match_faults(mine, labs, accept=(accept or {}).get(job))
        out.append(JobCheck(job, tuple(labs), mine, scoring))
    return tuple(out)


@dataclass(frozen=True)
class DemoResult:
    """What ran, what was found, and how it compares with what was injected."""

    train_job: str
    sim_job: str
    home: Path
    findings: tuple[Finding, ...]
    checks: tuple[JobCheck, ...]
    reports: dict[str, Path]
    report_error: str
    timings: dict[str, float] = field(default_factory=dict)
    min_iou: float = MIN_IOU
    kernel_job: str = ""

    @property
    def ok(self) -> bool:
        """Every injected fault (and the slowed rank) named with its class and a window of
        IoU ≥ ``min_iou``, and no other anomaly reported."""
        return all(c.ok(self.min_iou) for c in self.checks)


def read_findings(home: Path, jobs: Sequence[str]) -> list[Finding]:
    """The latest version of every anomaly of ``jobs`` from the demo's chDB store."""
    from argus.sinks import ChdbStore, SinkError

    params = {f"j{i}": j for i, j in enumerate(jobs)}
    try:
        store = ChdbStore(home / "clickhouse")
        try:
            rows = store.query_rows(
                "SELECT job, start_step, end_step, suspect, cause, ranks, score, evidence, step_ms_added, "
                "gpu_hours_lost, summary, suspect_kind, severity FROM anomalies FINAL "
                f"WHERE job IN ({', '.join(f'{{{k}:String}}' for k in params)}) "
                "ORDER BY job, start_step, suspect",
                params,
            )
        finally:
            store.close()
    except SinkError as exc:
        raise DemoError(
            f"cannot read the anomalies from ClickHouse at {home / 'clickhouse'}: {exc}"
        ) from None
    return [
        Finding(
            str(r[0]),
            int(r[1]),
            int(r[2]),
            str(r[3]),
            str(r[4]),
            tuple(int(x) for x in r[5]),
            float(r[6]),
            {str(k): float(v) for k, v in (r[7].items() if isinstance(r[7], dict) else r[7])},
            float(r[8]),
            float(r[9]),
            str(r[10]),
            str(r[11]),
            str(r[12]),
        )
        for r in rows
    ]


def train_label(cfg: DemoConfig) -> Label:
    """The real run's ground truth: the slowed rank, from ``slow_from`` to the last step."""
    rank = cfg.slow_rank
    return Label("compute_straggler", cfg.slow_from, cfg.train_steps - 1, "rank", f"rank:{rank}", (rank,))
