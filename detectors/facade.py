"""The facade: one call per completed step of a job, state kept as small plain data.

A stream worker keeps one :class:`JobState` per (job, run) (e.g. in a Faust table, via
:meth:`JobState.to_dict` / :meth:`JobState.from_dict`) and calls :func:`diagnose_step` (or
:meth:`JobDiagnoser.step`) once per completed step with the step's ``StepBatch``::

    diag = JobDiagnoser("job-1", run=0)
    for batch in steps:
        result = diag.step(batch, kernels=fetch_kernel_stats)
        publish(result.anomalies)        # schemas.Anomaly records
    publish(diag.flush())                # end of job: close what is open

Progressive: iteration level (job step time) and cross-rank level (every rank within its
pp stage) run every step; kernel statistics and stacks are asked for (through the
optional ``kernels``/``stacks`` callables) only for confirmed rank suspects and a few
healthy peers of their stage. Anomalies are emitted when an episode is confirmed (two
steps; one for one-off stalls) and again, with the same id and its final window and cost,
when it closes (``close_after`` steps without a sighting). Ids hash job, run, cause,
suspect and onset step, so a replay emits the same ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from argus.schemas import Anomaly, KernelStats, StackSample, StepBatch, StepSummary

from ._classes import ONE_OFF_CAUSES
from ._config import DiagnoserConfig
from ._finding import Finding
from .cost import gpu_hours, step_ms_added
from .cross_rank import METRICS, CrossRankResult, cross_rank
from .iteration import IterationState, IterationVerdict, attribute, iteration_level, update_baseline
from .kernel import kernel_level
from .rootcause import classify_ranks, stage_imbalance
from .stacks import stack_diff

__all__ = [
    "Deepen",
    "Episode",
    "JobDiagnoser",
    "JobState",
    "KernelSource",
    "StackSource",
    "StepFindings",
    "StepResult",
    "anomaly_id",
    "apply_findings",
    "diagnose",
    "diagnose_step",
    "step_findings",
]

KernelSource = Callable[[Sequence[int]], Mapping[int, KernelStats]]
"""Given ranks, their KernelStats for the step being diagnosed (missing ranks allowed)."""
StackSource = Callable[[Sequence[int]], Mapping[int, StackSample]]
"""Given ranks, their StackSample for the step being diagnosed (missing ranks allowed)."""


def anomaly_id(job: str, run: int, cause: str, suspect: str, onset: int) -> str:
    """Deterministic anomaly id: a hash of job, run, cause, suspect and onset step."""
    return hashlib.sha1(f"{job}|{run}|{cause}|{suspect}|{onset}".encode()).hexdigest()[:20]


@dataclass
class Episode:
    """One open suspect across steps (plain values only)."""

    cause: str
    level: str
    suspect_kind: str
    suspect: str
    ranks: list[int]
    onset: int
    last_seen: int
    hits: int
    emitted: bool
    score: float
    decided_by: str
    evidence: dict[str, float]
    added_ms_sum: float
    gpu_hours: float
    detected_ns: int = 0


@dataclass
class JobState:
    """Everything the diagnosis keeps about one job run between steps (a few KB).

    ``iteration``: the step-time baseline; ``episodes``: open suspects by
    ``cause|suspect``; ``last_step``: the last step diagnosed.
    """

    job: str
    run: int
    iteration: IterationState = field(default_factory=IterationState)
    episodes: dict[str, Episode] = field(default_factory=dict)
    last_step: int = -1

    @classmethod
    def new(cls, job: str, run: int, config: DiagnoserConfig | None = None) -> JobState:
        """The state of a job run before its first step."""
        cfg = config or DiagnoserConfig()
        return cls(job, run, IterationState(window=np.zeros(cfg.iter_window)))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (for a changelog-backed table)."""
        it = self.iteration
        return {
            "job": self.job,
            "run": self.run,
            "last_step": self.last_step,
            "iteration": {
                "window": it.window.tolist(),
                "n": it.n,
                "ref": it.ref.tolist(),
                "ckpt_ref_ms": it.ckpt_ref_ms,
            },
            "episodes": {k: asdict(e) for k, e in self.episodes.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobState:
        """Inverse of :meth:`to_dict`."""
        it = data["iteration"]
        return cls(
            job=data["job"],
            run=int(data["run"]),
            iteration=IterationState(
                np.asarray(it["window"], float),
                int(it["n"]),
                np.asarray(it["ref"], float),
                float(it["ckpt_ref_ms"]),
            ),
            episodes={k: Episode(**v) for k, v in data["episodes"].items()},
            last_step=int(data["last_step"]),
        )


@dataclass(frozen=True)
class StepResult:
    """What one step produced: anomalies to publish (new or closed episodes), every finding
    of the step (confirmed or not), the step's summary record and the iteration verdict."""

    anomalies: tuple[Anomaly, ...]
    findings: tuple[Finding, ...]
    summary: StepSummary
    iteration: IterationVerdict


def _anomaly(state: JobState, e: Episode) -> Anomaly:
    steps = max(e.hits, 1)
    ev = dict(e.evidence)
    summary = f"{e.cause} at {e.suspect}: decided by {e.decided_by}={ev.get(e.decided_by, float('nan')):.4g}"
    return Anomaly(
        id=anomaly_id(state.job, state.run, e.cause, e.suspect, e.onset),
        job=state.job,
        run=state.run,
        start_step=e.onset,
        end_step=e.last_seen,
        level=e.level,
        suspect_kind=e.suspect_kind,
        suspect=e.suspect,
        ranks=tuple(e.ranks),
        cause=e.cause,
        score=float(min(max(e.score, 0.0), 1e9)),
        evidence=ev,
        summary=summary[:4096],
        step_ms_added=e.added_ms_sum / steps,
        gpu_hours_lost=e.gpu_hours,
        detected_ns=e.detected_ns,
    )


def _peers(batch: StepBatch, cr: CrossRankResult, suspect_rows: np.ndarray, k: int, column: str) -> list[int]:
    """Up to ``k`` unflagged ranks of the suspects' group, spread over the group."""
    if k <= 0 or len(suspect_rows) == 0:
        return []
    g = batch[column][suspect_rows[0]]
    rows = np.flatnonzero(batch[column] == g)
    rows = rows[~np.isin(rows, cr.rows)]
    if len(rows) > k:
        rows = rows[np.linspace(0, len(rows) - 1, k).astype(int)]
    return [int(r) for r in batch["rank"][rows]]


def _deepen(
    f: Finding,
    batch: StepBatch,
    cr: CrossRankResult,
    cfg: DiagnoserConfig,
    kernels: KernelSource | None,
    stacks: StackSource | None,
    names: Mapping[int, str] | Sequence[str] | None,
) -> tuple[str, dict[str, float]]:
    """Kernel and stack evidence for a rank-level finding (progressive: suspects only)."""
    if not f.ranks or (kernels is None and stacks is None):
        return f.level, {}
    suspects = list(f.ranks[:3])
    srows = cr.rows[np.isin(cr.ranks, suspects)]
    peers = _peers(batch, cr, srows, cfg.kernel_peers, cfg.group_column)
    ev: dict[str, float] = {}
    level = f.level
    if kernels is not None and peers:
        got = kernels(suspects + peers)
        peer_stats = [got[p] for p in peers if p in got]
        if suspects[0] in got and peer_stats:
            kf = kernel_level(got[suspects[0]], peer_stats, names, rank=suspects[0])
            ev.update(kf.evidence())
            level = "kernel"
    if stacks is not None and peers:
        got_s = stacks(suspects + peers)
        peer_s = [got_s[p] for p in peers if p in got_s]
        if suspects[0] in got_s and peer_s:
            for d in stack_diff(got_s[suspects[0]], peer_s, top=2):
                ev[f"stack:{d.frame[:200]}"] = round(d.delta, 4)
    return level, ev


@dataclass(frozen=True)
class StepFindings:
    """The stateless, cross-rank half of one step's diagnosis (what the stream worker's
    cross-rank stage sends to its temporal stage, keyed by job): the job's step time and
    phase medians for the iteration level, the rank/stage findings, and the step summary."""

    job: str
    run: int
    step: int
    end_ns: int
    n_ranks: int
    step_ms: float
    job_median: np.ndarray
    findings: tuple[Finding, ...]
    summary: StepSummary

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {
            "job": self.job,
            "run": self.run,
            "step": self.step,
            "end_ns": self.end_ns,
            "n_ranks": self.n_ranks,
            "step_ms": self.step_ms,
            "job_median": self.job_median.tolist(),
            "findings": [
                {**asdict(f), "ranks": list(f.ranks), "evidence": dict(f.evidence)} for f in self.findings
            ],
            "summary": self.summary.to_avro(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepFindings:
        """Inverse of :meth:`to_dict`."""
        return cls(
            job=str(data["job"]),
            run=int(data["run"]),
            step=int(data["step"]),
            end_ns=int(data["end_ns"]),
            n_ranks=int(data["n_ranks"]),
            step_ms=float(data["step_ms"]),
            job_median=np.asarray(data["job_median"], dtype=float),
            findings=tuple(
                Finding(**{**f, "ranks": tuple(f["ranks"]), "evidence": dict(f["evidence"])})
                for f in data["findings"]
            ),
            summary=StepSummary.from_avro(data["summary"]),  # type: ignore[arg-type]
        )


def _cross_rank_stage(
    batch: StepBatch, cfg: DiagnoserConfig, missing: Sequence[int]
) -> tuple[StepFindings, CrossRankResult]:
    cr = cross_rank(batch, cfg)
    findings: list[Finding] = []
    if batch.step >= cfg.warmup_steps:
        if len(cr.rows):
            findings += classify_ranks(cr, batch["host"][cr.rows], batch["dp"][cr.rows], cfg)
        findings += stage_imbalance(cr, cfg.group_column, cfg)
    sf = StepFindings(
        job=batch.job,
        run=batch.run,
        step=batch.step,
        end_ns=int(batch["end_ns"].max()),
        n_ranks=cr.n_ranks,
        step_ms=cr.step_ms,
        job_median=cr.job_median,
        findings=tuple(findings),
        summary=_summary(batch, cr, findings, missing),
    )
    return sf, cr


def step_findings(
    batch: StepBatch, config: DiagnoserConfig | None = None, *, missing: Sequence[int] = ()
) -> StepFindings:
    """The cross-rank half of a step's diagnosis: needs the whole step, keeps no state.

    ``missing``: ranks the job expected that never reported this step (for the summary).
    """
    return _cross_rank_stage(batch, config or DiagnoserConfig(), missing)[0]


Deepen = Callable[[Finding], tuple[str, dict[str, float]]]
"""Given a newly confirmed finding, its level and extra (kernel, stack) evidence."""


def apply_findings(
    state: JobState, sf: StepFindings, config: DiagnoserConfig | None = None, *, deepen: Deepen | None = None
) -> StepResult:
    """The temporal half: fold one step's findings into the job's state (iteration baseline,
    episodes) and return the anomalies to publish; updates ``state`` in place. Steps must
    come in order; ``deepen`` adds kernel/stack evidence when an episode is confirmed."""
    cfg = config or DiagnoserConfig()
    step = sf.step
    verdict = iteration_level(state.iteration, step, sf.step_ms, sf.job_median, cfg)
    findings = list(sf.findings)
    if step >= cfg.warmup_steps and not findings:
        job = attribute(verdict, cfg)
        if job is not None:
            findings.append(job)
    if not findings and not verdict.anomalous:
        update_baseline(state.iteration, verdict, step, sf.job_median, cfg)
    out: list[Anomaly] = []
    for f in findings:
        added = step_ms_added(f.step_ms_added, sf.step_ms)
        e = state.episodes.get(f.key)
        if e is None:
            e = Episode(
                f.cause, f.level, f.suspect_kind, f.suspect, list(f.ranks), step, step, 0, False,
                f.score, f.decided_by, dict(f.evidence), 0.0, 0.0,
            )  # fmt: skip
            state.episodes[f.key] = e
        e.last_seen = step
        e.hits += 1
        e.added_ms_sum += added
        e.gpu_hours += gpu_hours(added, sf.n_ranks)
        if f.score >= e.score or not e.emitted:
            e.score = max(e.score, f.score)
            e.evidence.update(f.evidence)
            e.ranks = sorted(set(e.ranks) | set(f.ranks))[:64]
        need = 1 if f.cause in ONE_OFF_CAUSES else cfg.confirm_steps
        if not e.emitted and e.hits >= need:
            if deepen is not None:
                level, extra = deepen(f)
                e.level = level
                e.evidence.update(extra)
            e.emitted = True
            e.detected_ns = sf.end_ns
            out.append(_anomaly(state, e))
    for key in [k for k, e in state.episodes.items() if step - e.last_seen > cfg.close_after]:
        e = state.episodes.pop(key)
        if e.emitted:
            out.append(_anomaly(state, e))
    if len(state.episodes) > cfg.max_open:
        stale = sorted((e.last_seen, k) for k, e in state.episodes.items() if not e.emitted)
        for _, k in stale[: len(state.episodes) - cfg.max_open]:
            state.episodes.pop(k)
    state.last_step = step
    return StepResult(tuple(out), tuple(findings), sf.summary, verdict)


def diagnose_step(
    state: JobState,
    batch: StepBatch,
    config: DiagnoserConfig | None = None,
    *,
    kernels: KernelSource | None = None,
    stacks: StackSource | None = None,
    names: Mapping[int, str] | Sequence[str] | None = None,
) -> StepResult:
    """Diagnose one completed step; updates ``state`` in place.

    The composition of :func:`step_findings` (cross-rank, stateless) and
    :func:`apply_findings` (temporal, stateful), with kernel and stack evidence for newly
    confirmed suspects.

    Args:
        state: the job's state (from the previous step, or a new ``JobState(job, run)``).
        batch: every rank's record of the step (a subset is fine; any order).
        config: thresholds.
        kernels, stacks: optional sources of kernel statistics / stack samples, asked only
            for newly confirmed rank suspects and a few of their healthy peers.
        names: kernel id -> name for the kernel level.

    Returns:
        A :class:`StepResult`; publish ``result.anomalies``.
    """
    cfg = config or DiagnoserConfig()
    sf, cr = _cross_rank_stage(batch, cfg, ())

    def deepen(f: Finding) -> tuple[str, dict[str, float]]:
        return _deepen(f, batch, cr, cfg, kernels, stacks, names)

    return apply_findings(state, sf, cfg, deepen=deepen)


def _summary(
    batch: StepBatch, cr: CrossRankResult, findings: Sequence[Finding], missing: Sequence[int] = ()
) -> StepSummary:
    jm = dict(zip(METRICS, cr.job_median.tolist(), strict=True))
    suspects = sorted({r for f in findings for r in f.ranks})[:64]
    step_ms = (batch["end_ns"] - batch["start_ns"]) / 1e6
    return StepSummary(
        job=batch.job,
        run=batch.run,
        step=batch.step,
        end_ns=int(batch["end_ns"].max()),
        ranks=len(batch),
        missing=tuple(int(r) for r in missing),
        step_ms_median=cr.step_ms,
        step_ms_p99=float(np.percentile(step_ms, 99)),
        step_ms_max=float(step_ms.max()),
        compute_ms_median=jm["compute_ms"],
        collective_ms_median=jm["collective_ms"],
        dataloader_ms_median=jm["dataloader_ms"],
        checkpoint_ms_max=float(batch["checkpoint_ms"].max()),
        tokens=int(batch["tokens"].sum()),
        suspects=tuple(suspects),
    )


class JobDiagnoser:
    """HTA-style facade over one job run: holds the :class:`JobState` and the config.

    ``step(batch)`` diagnoses one completed step (see :func:`diagnose_step`); ``flush()``
    closes every open episode (end of the job) and returns the final anomalies;
    ``state`` is the plain-data state to persist between steps.
    """

    def __init__(
        self, job: str, run: int = 0, config: DiagnoserConfig | None = None, state: JobState | None = None
    ) -> None:
        self.config = config or DiagnoserConfig()
        self.state = state or JobState.new(job, run, self.config)

    def step(
        self,
        batch: StepBatch,
        *,
        kernels: KernelSource | None = None,
        stacks: StackSource | None = None,
        names: Mapping[int, str] | Sequence[str] | None = None,
    ) -> StepResult:
        """Diagnose one completed step (updates the state)."""
        return diagnose_step(self.state, batch, self.config, kernels=kernels, stacks=stacks, names=names)

    def flush(self) -> list[Anomaly]:
        """Close every open episode; the final version of each confirmed one."""
        out = [_anomaly(self.state, e) for e in self.state.episodes.values() if e.emitted]
        self.state.episodes.clear()
        return out


def diagnose(
    batches: Iterable[StepBatch],
    config: DiagnoserConfig | None = None,
    *,
    job: str | None = None,
    run: int = 0,
) -> list[Anomaly]:
    """Diagnose a whole run offline: the final version of every anomaly, by onset."""
    diag: JobDiagnoser | None = None
    final: dict[str, Anomaly] = {}
    for b in batches:
        if diag is None:
            diag = JobDiagnoser(job or b.job, b.run if job is None else run, config)
        for a in diag.step(b).anomalies:
            final[a.id] = a
    if diag is not None:
        for a in diag.flush():
            final[a.id] = a
    return sorted(final.values(), key=lambda a: (a.start_step, a.cause, a.suspect))
