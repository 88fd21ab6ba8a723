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
healthy peers of their stage. Anomalies are emitted when an episode is confirmed (four
sightings, or one costly one-off stall), again every ``update_every`` steps while it lasts
(so a job that simply ends leaves its anomaly's window right), and, with the same id and its
final window and cost, when it closes. Ids hash job, run, cause,
suspect and onset step, so a replay emits the same ids.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from argus.schemas import (
    Anomaly,
    KernelStats,
    StackSample,
    StepBatch,
    StepFindings,
    StepSummary,
    ValidationError,
)
from argus.schemas.causes import (
    CHECKPOINT_STALL,
    COMPUTE_STRAGGLER,
    MASKED_COMPUTE_STRAGGLER,
    ONE_OFF_CAUSES,
    PIPELINE_STAGE_IMBALANCE,
    SEQUENCE_LENGTH_IMBALANCE,
    UNKNOWN,
)

from ._config import DiagnoserConfig
from ._finding import Finding, anomaly_id
from .changepoint import ChangeState, RankResiduals, step_residuals, track
from .common_cause import CHANGE_FIGURE, cause_findings
from .cost import gpu_hours, step_ms_added
from .cross_rank import METRICS, CrossRankResult, clean_step_ms, cross_rank, job_reference
from .deepen import Deepening, deepen_ranks
from .iteration import (
    IterationState,
    IterationVerdict,
    attribute,
    is_global_step,
    iteration_level,
    update_baseline,
)
from .rootcause import classify_ranks, stage_imbalance

_WARN_CAUSES = frozenset({PIPELINE_STAGE_IMBALANCE, SEQUENCE_LENGTH_IMBALANCE})

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
    "check_shape",
    "diagnose",
    "diagnose_step",
    "refresh",
    "step_findings",
]

KernelSource = Callable[[Sequence[int]], Mapping[int, KernelStats]]
"""Given ranks, their KernelStats for the step being diagnosed (missing ranks allowed)."""
StackSource = Callable[[Sequence[int]], Mapping[int, StackSample]]
"""Given ranks, their StackSample for the step being diagnosed (missing ranks allowed)."""


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
    persistent: bool = False
    severity: str = "page"
    idle: int = 0
    reported: int = -1
    hits_at: list[int] = field(default_factory=list)
    peers: list[int] = field(default_factory=list)
    deepen_left: int = 0
    detail: str = ""
    change_onset: int = -1
    prior_rate: float = 0.0


STATE_VERSION = 2
"""The version :meth:`JobState.to_dict` writes (1: before it was written; 2: stamped,
read field-tolerantly). Raise it when a field's meaning changes; rename through
:data:`EPISODE_RENAMES`."""

EPISODE_RENAMES: Mapping[str, str] = {}
"""An Episode field's former name -> its name now (read from an older build's state)."""

_BLANK = {"str": "", "int": 0, "float": 0.0, "bool": False}


def _episode(data: Mapping[str, Any]) -> Episode:
    """An Episode from any version's dict: renamed fields under their new names, unknown
    ones ignored, missing ones as their defaults (blank when they have none)."""
    fields = {f.name: f for f in dataclasses.fields(Episode)}
    values = {EPISODE_RENAMES.get(k, k): v for k, v in data.items()}
    kw: dict[str, Any] = {k: v for k, v in values.items() if k in fields}
    for name, f in fields.items():
        if name not in kw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kind = str(f.type)
            kw[name] = _BLANK[kind] if kind in _BLANK else ({} if kind.startswith("dict") else [])
    return Episode(**kw)


@dataclass
class JobState:
    """Everything the diagnosis keeps about one job run between steps (a few KB).

    ``iteration``: the step-time baseline; ``episodes``: open suspects by
    ``cause|suspect``; ``last_step``: the last step diagnosed; ``first_step``: the first
    step past the warm-up; ``transients``: per suspect, the sightings that never became
    an anomaly (one-step blips), at most ``max_open`` suspects; ``closed``: anomalies closed
    lately, which the same fault confirmed again continues (:func:`_recurring`);
    ``global_run``: how many steps in a row every rank has been far slower than usual;
    ``fast_run``: how many steps in a row the job has been far faster than ``fast_ref``, its
    baseline's step time when that run began (a warm-up ending: :func:`_settle`);
    ``settled``: the warm-up's end was found (it ends once); ``flagged``: per rank, the
    steps since ``first_step`` (of ``flag_steps``, global ones left out) it was flagged or
    weakly flagged in: how often it stood out before an episode of it opened.
    """

    job: str
    run: int
    iteration: IterationState = field(default_factory=IterationState)
    episodes: dict[str, Episode] = field(default_factory=dict)
    last_step: int = -1
    first_step: int = -1
    transients: dict[str, int] = field(default_factory=dict)
    closed: dict[str, Episode] = field(default_factory=dict)
    steps: int = 0
    last_end_ns: int = 0
    n_ranks: int = 0
    global_run: int = 0
    fast_run: int = 0
    fast_ref: float = 0.0
    settled: bool = False
    changes: ChangeState = field(default_factory=ChangeState)
    flagged: dict[int, int] = field(default_factory=dict)
    flag_steps: int = 0

    @classmethod
    def new(cls, job: str, run: int, config: DiagnoserConfig | None = None) -> JobState:
        """The state of a job run before its first step."""
        cfg = config or DiagnoserConfig()
        return cls(job, run, IterationState(window=np.zeros(cfg.iter_window)))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (for a changelog-backed table), stamped with
        :data:`STATE_VERSION`."""
        it = self.iteration
        return {
            "version": STATE_VERSION,
            "job": self.job,
            "run": self.run,
            "last_step": self.last_step,
            "iteration": {
                "window": it.window.tolist(),
                "n": it.n,
                "ref": it.ref.tolist(),
                "ckpt_ref_ms": it.ckpt_ref_ms,
                "work_ref_ms": it.work_ref_ms,
            },
            "episodes": {k: asdict(e) for k, e in self.episodes.items()},
            "first_step": self.first_step,
            "steps": self.steps,
            "last_end_ns": self.last_end_ns,
            "n_ranks": self.n_ranks,
            "global_run": self.global_run,
            "fast_run": self.fast_run,
            "fast_ref": self.fast_ref,
            "settled": self.settled,
            "transients": dict(self.transients),
            "closed": {k: asdict(e) for k, e in self.closed.items()},
            "changes": self.changes.to_dict(),
            "flagged": {str(r): n for r, n in self.flagged.items()},
            "flag_steps": self.flag_steps,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobState:
        """Inverse of :meth:`to_dict`, for any version's dict (a rolling upgrade restores
        what the previous build wrote, a rollback what the next wrote): fields it does not
        know are ignored, fields it lacks start as a new job's (:func:`_episode`)."""
        it = data.get("iteration", {})
        blank = IterationState()
        return cls(
            job=data["job"],
            run=int(data["run"]),
            iteration=IterationState(
                np.asarray(it.get("window", blank.window), float),
                int(it.get("n", 0)),
                np.asarray(it.get("ref", blank.ref), float),
                float(it.get("ckpt_ref_ms", 0.0)),
                float(it.get("work_ref_ms", 0.0)),
            ),
            episodes={k: _episode(v) for k, v in data.get("episodes", {}).items()},
            last_step=int(data.get("last_step", -1)),
            first_step=int(data.get("first_step", -1)),
            steps=int(data.get("steps", 0)),
            last_end_ns=int(data.get("last_end_ns", 0)),
            n_ranks=int(data.get("n_ranks", 0)),
            global_run=int(data.get("global_run", 0)),
            fast_run=int(data.get("fast_run", 0)),
            fast_ref=float(data.get("fast_ref", 0.0)),
            settled=bool(data.get("settled", False)),
            transients={str(k): int(v) for k, v in data.get("transients", {}).items()},
            closed={k: _episode(v) for k, v in data.get("closed", {}).items()},
            changes=ChangeState.from_dict(data.get("changes")),
            flagged={int(r): int(n) for r, n in data.get("flagged", {}).items()},
            flag_steps=int(data.get("flag_steps", 0)),
        )


@dataclass(frozen=True)
class StepResult:
    """What one step produced: anomalies to publish (new or closed episodes), every finding
    of the step (confirmed or not), the step's summary record and the iteration verdict
    (transients are counted in the state: ``JobState.transients``)."""

    anomalies: tuple[Anomaly, ...]
    findings: tuple[Finding, ...]
    summary: StepSummary
    iteration: IterationVerdict


def _anomaly(state: JobState, e: Episode) -> Anomaly:
    steps = max(e.hits, 1)
    ev = dict(e.evidence)
    ev["steps_seen"] = float(e.hits)
    if e.persistent:
        ev["persistent"] = 1.0
    since = " since the job's start" if e.persistent else ""
    summary = (
        f"{e.cause} at {e.suspect}{since}: decided by {e.decided_by}="
        f"{ev.get(e.decided_by, float('nan')):.4g}, seen in {e.hits} step(s)"
    )
    if ev.get("period_steps"):
        summary += f"; slow every {ev['period_steps']:.0f} steps"
    if e.detail:
        summary += f"; {e.detail}"
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
        severity=e.severity,
    )


_PEER_SAMPLE = 4096
_MAX_PEERED = 64


def _peer_table(
    batch: StepBatch, cr: CrossRankResult, ranks: Sequence[int], k: int, column: str
) -> dict[int, tuple[int, ...]]:
    """For each of ``ranks`` (the first ``_MAX_PEERED``), up to ``k`` unflagged ranks of its
    group, spread over the group: looked for in a strided sample of the step's rows first
    (a few thousand rows, not the whole job), in every row only when the sample has too few."""
    if k <= 0 or not len(ranks):
        return {}
    rank_col, groups = batch["rank"], batch[column]
    n = len(rank_col)
    sample = np.arange(0, n, max(1, n // _PEER_SAMPLE))
    flagged = np.zeros(n, bool)
    flagged[cr.rows] = True
    by_group: dict[Any, tuple[int, ...]] = {}
    out: dict[int, tuple[int, ...]] = {}
    for r in list(dict.fromkeys(int(x) for x in ranks))[:_MAX_PEERED]:
        row = r if r < n and rank_col[r] == r else int(next(iter(np.flatnonzero(rank_col == r)), -1))
        if row < 0:
            continue
        g = groups[row]
        if g not in by_group:
            cand = sample[groups[sample] == g]
            cand = cand[~flagged[cand]]
            if len(cand) < k:
                cand = np.flatnonzero((groups == g) & ~flagged)
            if len(cand) > k:
                cand = cand[np.linspace(0, len(cand) - 1, k).astype(int)]
            by_group[g] = tuple(int(x) for x in rank_col[cand])
        out[r] = by_group[g]
    return out


_DEEP_KINDS = frozenset({"rank", "link", "host", "ranks"})


def check_shape(sf: StepFindings) -> None:
    """Raise :class:`ValidationError` unless ``sf`` fits these detectors' temporal half: one
    job reference per :data:`METRICS`. Findings read from a topic passed the schema's range
    checks, but another build (or a hostile producer) may have made them."""
    if len(sf.job_median) != len(METRICS):
        raise ValidationError(
            f"StepFindings: job_median holds {len(sf.job_median)} metrics, these detectors {len(METRICS)}"
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
    reference = job_reference(cr)
    wanted = [r for f in findings if f.suspect_kind in _DEEP_KINDS for r in f.ranks[:3]]
    peers = _peer_table(batch, cr, wanted, cfg.kernel_peers, cfg.group_column)
    sf = StepFindings(
        job=batch.job,
        run=batch.run,
        step=batch.step,
        end_ns=int(batch["end_ns"].max()),
        n_ranks=cr.n_ranks,
        step_ms=cr.step_ms,
        job_median=reference,
        findings=tuple(findings),
        summary=_summary(batch, cr, findings, missing),
        weak=tuple(cr.weak.tolist()),
        job_ms=clean_step_ms(reference),
        peers=peers,
    )
    return sf, cr


def step_findings(
    batch: StepBatch, config: DiagnoserConfig | None = None, *, missing: Sequence[int] = ()
) -> StepFindings:
    """The cross-rank half of a step's diagnosis: needs the whole step, keeps no state.

    ``missing``: ranks the job expected that never reported this step (for the summary).
    """
    return _cross_rank_stage(batch, config or DiagnoserConfig(), missing)[0]


Deepen = Callable[[Sequence[int], Sequence[int], int], Deepening | None]
"""Given a confirmed anomaly's suspect ranks, healthy peers of their group and its onset
step, what their kernels and stacks say from that step on (:func:`detectors.deepen.deepen_ranks`
over the caller's data), or None when there is no such data yet."""


def apply_findings(
    state: JobState,
    sf: StepFindings,
    config: DiagnoserConfig | None = None,
    *,
    deepen: Deepen | None = None,
    residuals: RankResiduals | None = None,
) -> StepResult:
    """The temporal half: fold one step's findings into the job's state (iteration baseline,
    episodes) and return the anomalies to publish; updates ``state`` in place. Steps must
    come in order; ``deepen`` adds kernel/stack evidence when an episode is confirmed (and,
    while none explains it, on each of the next ``deepen_steps`` steps: sketches that come
    late still deepen it, and the anomaly is sent again, ``level="kernel"``; steps without any
    data for the suspect do not count).

    Severity (docs/architecture.md#engine): a sighting becomes an anomaly once it is sustained (seen in
    ``min_steps`` steps, gaps up to ``close_after`` bridged) or, for a one-off stall, once
    it cost at least ``min_cost_frac`` of a step; otherwise it closes as a transient. On a
    step the whole job is far slower than its baseline (evaluation, checkpoint, warm-up),
    rank findings open no episode, but a confirmed one still open goes on (its rank still
    stands out). A rank already part of an open host or link episode adds to it, so a host
    fault stays one anomaly. An episode that starts with the job is a persistent straggler:
    one anomaly of severity ``warn``, closed only after ``persistent_close_after`` steps
    without a sighting.

    ``residuals`` (:func:`detectors.changepoint.step_residuals` of the step's batch) feed
    each rank's change-point test: an open change is a sighting of its common cause
    (:mod:`detectors.common_cause`), confirmed at once with the change's onset; in a job
    of fewer than ``small_job`` ranks a rank that stands out only against its few peers,
    not against its own past, is no sighting.
    """
    cfg = config or DiagnoserConfig()
    verdict, findings, glob = _job_level(state, sf, cfg)
    if residuals is not None:
        findings = _with_changes(state, sf, findings, residuals, glob, cfg)
    out, seen = _sightings(state, sf, findings, verdict, cfg, deepen)
    if not glob:
        _count_flags(state, sf, findings, cfg)
    if deepen is not None:  # sketches that came after the confirming step
        out += _deepen_late(state, sf.step, deepen)
    if not glob:  # a global step is no evidence either way
        out += _unsighted(state, seen, set(sf.weak), verdict, cfg)
    _forget_stale(state, cfg)
    state.last_step = sf.step
    state.last_end_ns = max(state.last_end_ns, sf.end_ns)
    state.n_ranks = max(state.n_ranks, sf.n_ranks)
    return StepResult(tuple(out), tuple(findings), sf.summary, verdict)


def _job_level(
    state: JobState, sf: StepFindings, cfg: DiagnoserConfig
) -> tuple[IterationVerdict, list[Finding], bool]:
    """The iteration level of one step: its verdict against the job's baseline, the step's
    findings (without the rank ones on a global step; with the job's own when no rank
    explains a rise) and whether the step is global; the baseline and step counts updated."""
    step = sf.step
    job_ms = sf.job_ms if sf.job_ms >= 0 else sf.step_ms
    verdict = iteration_level(state.iteration, step, job_ms, sf.job_median, cfg)
    if _settle(state, verdict, cfg):
        state.settled = True
        state.iteration.n = 0  # the baseline starts afresh without the warm-up's slow steps
        state.changes = ChangeState()  # and so do the ranks' own baselines
        state.flagged, state.flag_steps = {}, 0
        state.first_step = step - cfg.min_steps + 1
    elif state.first_step < 0 and step >= cfg.warmup_steps:
        state.first_step = step
    if step >= cfg.warmup_steps:
        state.steps += 1
    findings = list(sf.findings)
    glob = is_global_step(state.iteration, sf.job_median, cfg.global_ratio)
    state.global_run = state.global_run + 1 if glob else 0
    if glob:  # no new rank episode; a confirmed one its rank still stands out in goes on
        groups = _group_index(state)
        findings = [f for f in findings if f.level != "cross_rank" or _confirmed_open(state, f, groups)]
    # an evaluation or a checkpoint is a few global steps; the whole job slow for longer is news
    sustained = state.global_run > 2 * cfg.min_steps
    if step >= cfg.warmup_steps and (sustained or not glob) and not _explained(state, findings, verdict):
        job = attribute(verdict, cfg)
        if job is not None:
            findings.append(job)
    if not glob:
        _follow_baseline(state, sf, verdict, cfg)
    return verdict, findings, glob


def _with_changes(
    state: JobState,
    sf: StepFindings,
    findings: list[Finding],
    res: RankResiduals,
    glob: bool,
    cfg: DiagnoserConfig,
) -> list[Finding]:
    """The step's findings with its change points: the residuals folded into each rank's
    test (not on a global step, which says nothing about a rank), a finding per common
    cause of the open changes; in a small job, rank findings of ranks whose own past shows
    no change (learned, nothing open) dropped."""
    if sf.step < cfg.warmup_steps:
        return findings
    if not glob:
        track(state.changes, res, sf.step, cfg)
    ch = state.changes
    if sf.n_ranks < cfg.small_job and ch.n_ranks:
        learned: np.ndarray = np.asarray(ch.n[0] >= cfg.cp_learn)
        opened: np.ndarray = np.asarray((ch.onset >= 0).any(axis=0))

        def own_past_agrees(f: Finding) -> bool:
            if f.level != "cross_rank" or f.suspect_kind != "rank" or f.cause in ONE_OFF_CAUSES:
                return True
            r = f.ranks[0]
            return r >= ch.n_ranks or not learned[r] or bool(opened[r])

        findings = [f for f in findings if own_past_agrees(f)]
    # a whole stage slower than the others is the stage's finding (the layout's), not its ranks'
    stages = {f.suspect for f in findings if f.suspect_kind == "stage"}
    changes = [f for f in cause_findings(ch, res, cfg) if f.suspect not in stages]
    return [*findings, *changes]


def _count_flags(
    state: JobState, sf: StepFindings, findings: Sequence[Finding], cfg: DiagnoserConfig
) -> None:
    """Each rank flagged (or weakly) this step, counted from the job's first settled step,
    but not while it is part of an anomaly."""
    if state.first_step < 0 or sf.step < state.first_step:
        return
    state.flag_steps += 1
    ranks = {int(r) for r in sf.weak}
    ranks.update(r for f in findings if f.level == "cross_rank" for r in f.ranks)
    # a fault's own sightings are not its rank's baseline (a flapping rank would become one)
    ranks.difference_update(
        r
        for e in (*state.episodes.values(), *state.closed.values())
        if e.emitted and e.reported != _SILENT
        for r in e.ranks
    )
    for r in ranks:
        if r in state.flagged or len(state.flagged) < cfg.max_tracked:
            state.flagged[r] = state.flagged.get(r, 0) + 1


def _prior_rate(state: JobState, ranks: Sequence[int], cfg: DiagnoserConfig) -> float:
    """How often ``ranks`` stood out (flagged or weakly) before now, on average (0 before
    ``min_steps`` counted steps)."""
    if state.flag_steps < cfg.min_steps or not ranks:
        return 0.0
    return sum(state.flagged.get(r, 0) for r in ranks) / (len(ranks) * state.flag_steps)


def _confirmed_open(state: JobState, f: Finding, groups: Mapping[tuple[str, int], str]) -> bool:
    """Whether ``f`` is a sighting of an open, confirmed episode (on a step every rank is slow,
    a straggler that still stands out among them is still that fault: its window goes on)."""
    e = state.episodes.get(_route(f, groups))
    return e is not None and e.emitted


def _follow_baseline(
    state: JobState, sf: StepFindings, verdict: IterationVerdict, cfg: DiagnoserConfig
) -> None:
    """The baseline stands still while a fault is confirmed. Until then every step goes into
    its ring (where a share of steps is slow on every rank, that is the job's pace), but an
    anomalous one not into the phase reference a rise is attributed against. A job-wide
    change that lasted ``iter_adopt_steps`` is taken in as the job's new level (a schedule or
    data change, a permanent loss): its anomaly closes as the baseline catches up."""
    emitted = [e for e in state.episodes.values() if e.emitted]
    adopting = any(e.level == "iteration" and sf.step - e.onset >= cfg.iter_adopt_steps for e in emitted)
    if adopting or not emitted:
        update_baseline(
            state.iteration, verdict, sf.step, sf.job_median, cfg, phases=adopting or not verdict.anomalous
        )


def _sightings(
    state: JobState,
    sf: StepFindings,
    findings: Sequence[Finding],
    verdict: IterationVerdict,
    cfg: DiagnoserConfig,
    deepen: Deepen | None,
) -> tuple[list[Anomaly], set[str]]:
    """Each finding a sighting of its episode (opened when new; group findings first, so
    that their ranks' findings add to them): the anomalies it confirms or updates, and the
    keys of the episodes sighted."""
    base_ms = verdict.base_ms if verdict.base_ms > 0 else sf.step_ms
    out: list[Anomaly] = []
    groups = _group_index(state)
    seen: set[str] = set()
    routed = [g for f in findings for g in _split(f, groups, state, cfg)]
    for f in sorted(routed, key=lambda f: f.suspect_kind not in _GROUP_KINDS):
        key, e = _episode_of(state, f, groups, sf, cfg)
        if f.suspect_kind == "ranks" and e.hits and 2 * len(set(f.ranks) & set(e.ranks)) < len(f.ranks):
            continue  # other ranks of the group than before: noise moving about, not one fault
        if key in seen:  # a second finding of the same episode in this step
            e.ranks = sorted(set(e.ranks) | set(f.ranks))[: cfg.max_listed]
            if f.decided_by == CHANGE_FIGURE:
                _sight_change(e, f, step_ms_added(f.step_ms_added, sf.step_ms), sf)
                if not e.emitted and (a := _confirm(state, key, e, sf, cfg, deepen)) is not None:
                    out.append(a)
            continue
        if _faint(e, f, sf, cfg):
            continue
        seen.add(key)
        added = _sight(e, f, sf, cfg)
        if f.decided_by == CHANGE_FIGURE:
            _sight_change(e, f, added, sf)
        if not e.emitted and _confirmed(e, added, base_ms, cfg, sf.n_ranks):
            if (a := _confirm(state, key, e, sf, cfg, deepen)) is not None:
                out.append(a)
        elif (a := _escalate(state, e, sf, cfg)) is not None:
            out.append(a)
        elif e.emitted and sf.step - e.reported >= cfg.update_every:  # a live window and cost
            e.reported = sf.step
            out.append(_anomaly(state, e))
    return out, seen


def _sight_change(e: Episode, f: Finding, added: float, sf: StepFindings) -> None:
    """A change point sighted: the episode's fault began at the change's onset, and was
    there on every step since (the evidence of a change is their sum)."""
    onset = int(f.evidence.get("change_onset", sf.step))
    if "period_steps" in f.evidence:  # slow every k-th step: said in its summary
        e.evidence["period_steps"] = f.evidence["period_steps"]
    e.change_onset = onset if e.change_onset < 0 else min(e.change_onset, onset)
    steps = sf.step - e.change_onset + 1
    if not e.emitted and steps > e.hits:
        more = steps - e.hits
        e.hits = steps
        e.added_ms_sum += more * added
        e.gpu_hours += more * gpu_hours(added, sf.n_ranks)


def _faint(e: Episode, f: Finding, sf: StepFindings, cfg: DiagnoserConfig) -> bool:
    """Whether a finding is too faint to be more of a confirmed fault: it adds less than
    ``faint_frac`` of what the fault added per sighting (the noise of a busy host flagging
    the same rank after the fault ended would otherwise carry its window on)."""
    if not e.emitted or e.hits < cfg.min_steps or e.added_ms_sum <= 0:
        return False
    return step_ms_added(f.step_ms_added, sf.step_ms) < cfg.faint_frac * e.added_ms_sum / e.hits


def _beyond_baseline(base: Episode, f: Finding, sf: StepFindings, share: float = 1.0) -> bool:
    """Whether a finding of a rank or group that is slow from the job's start (its baseline:
    a static offset, a speed group) says it is now slower than that: it adds ``share`` of a
    tenth of a step more than the baseline added per sighting on average."""
    if base.reported != _SILENT or base.hits <= 0:
        return False
    added = step_ms_added(f.step_ms_added, sf.step_ms)
    return added >= base.added_ms_sum / base.hits + share * _BEYOND_FRAC * sf.step_ms


def _episode_of(
    state: JobState, f: Finding, groups: dict[tuple[str, int], str], sf: StepFindings, cfg: DiagnoserConfig
) -> tuple[str, Episode]:
    """The episode a finding is a sighting of, opened at ``step`` when there is none (a new
    host or link episode takes over its ranks' open ones, and their later findings)."""
    key = _route(f, groups)
    if f.decided_by == CHANGE_FIGURE and key not in state.episodes:  # a host or link not confirmed yet
        members = set(f.ranks)
        key = next(
            (
                k
                for k, o in state.episodes.items()
                if o.suspect_kind in _GROUP_KINDS and members & set(o.ranks)
            ),
            key,
        )
    old = state.episodes.get(key)
    change = (
        old is not None
        and old.persistent
        and (
            f.decided_by == CHANGE_FIGURE
            # hysteresis: an open change goes on down to half its threshold
            or (
                not cfg.change_points  # with them on, a change from a baseline is theirs
                and _beyond_baseline(old, f, sf, 0.5 if f"{f.key}|change" in state.episodes else 1.0)
            )
        )
    )
    if old is not None and change:  # a change from a baseline: its sightings, until it ends
        key = f"{f.key}|change"
        old.idle = 0
    e = state.episodes.get(key)
    if e is None:
        e = state.episodes[key] = _open(f, sf.step)
        if not change:  # a baseline's ranks stood out before: that was the baseline
            e.prior_rate = _prior_rate(state, f.ranks, cfg)
        if f.suspect_kind in _GROUP_KINDS:
            _absorb(state, key, e)
            if f.suspect_kind not in ("ranks", "host"):
                groups.update({(_family(f.cause), r): key for r in f.ranks})
    return key, e


def _sight(e: Episode, f: Finding, sf: StepFindings, cfg: DiagnoserConfig) -> float:
    """One sighting of an episode in step ``sf``: its window, sightings, cost, and (when this
    one scores as high, or it is not confirmed yet) its evidence and ranks; the step time
    it added."""
    added = step_ms_added(f.step_ms_added, sf.step_ms)
    e.last_seen = sf.step
    e.idle = 0
    e.hits_at = [*e.hits_at[-7:], sf.step]
    e.hits += 1
    e.added_ms_sum += added
    e.gpu_hours += gpu_hours(added, sf.n_ranks)
    if f.score >= e.score or not e.emitted:
        e.score = max(e.score, f.score)
        e.evidence.update(f.evidence)
        e.ranks = sorted(set(e.ranks) | set(f.ranks))[: cfg.max_listed]
    if f.ranks and f.ranks[0] in sf.peers:
        e.peers = list(sf.peers[f.ranks[0]])
    return added


_SILENT = 10**15
"""``reported`` of a persistent episode: never sent."""
_BEYOND_FRAC = 0.1
"""How much more of a step a baseline's rank or group must add to be a change from it."""
_BASELINE_KINDS = frozenset({"rank", "host", "ranks"})
_BASELINE_CAUSES = frozenset({COMPUTE_STRAGGLER, MASKED_COMPUTE_STRAGGLER, UNKNOWN})
"""What a slower machine or a speed group looks like: a layout's imbalance (a slow stage,
uneven sequence lengths) or a link since the start is still reported (a warning)."""


def _confirm(
    state: JobState, key: str, e: Episode, sf: StepFindings, cfg: DiagnoserConfig, deepen: Deepen | None
) -> Anomaly | None:
    """A newly confirmed episode's anomaly: the same fault back continues the anomaly that
    closed lately; else its onset, persistence and severity are decided now, and the kernel
    level has its first try. A rank or group slow from the job's first step past its
    warm-up is its baseline (a static offset, a persistent speed group): the episode stays,
    silent, so its sightings make no other; a change from it is the change points' (None).
    One first seen a step or two later is a straggler since the start: a warning."""
    old = _recurring(state, key, e, cfg)
    if old is not None:  # the same fault back: its anomaly goes on
        e = state.episodes[key] = _continue(old, e, cfg)
        e.reported = sf.step
        return _anomaly(state, e)
    e.emitted = True
    e.onset = min(_onset(e), e.change_onset) if e.change_onset >= 0 else _onset(e)
    e.persistent = _persistent(e, state, cfg)
    if (  # a baseline: silent; a change from it opens its own episode (_episode_of)
        (_static(state, e, sf, cfg) or e.prior_rate >= cfg.baseline_rate)
        and e.suspect_kind in _BASELINE_KINDS
        and e.cause in _BASELINE_CAUSES
    ):
        e.reported = _SILENT
        return None
    e.severity = _severity(e, cfg, _page_hits(cfg, max(state.n_ranks, sf.n_ranks), e.level), sf.step_ms)
    _drop_before_onset(e)
    e.detected_ns = sf.end_ns
    e.reported = sf.step
    if deepen is not None and e.suspect_kind in _DEEP_KINDS:
        e.deepen_left = cfg.deepen_steps + 1
        _deepen(e, deepen)
    return _anomaly(state, e)


def _static(state: JobState, e: Episode, sf: StepFindings, cfg: DiagnoserConfig) -> bool:
    """Whether a fault seen from about the job's start is its baseline: since the start
    (:func:`_persistent`) and one of a speed group (two more suspects slow since the start),
    or a static offset (it adds at most ``baseline_max_frac`` of a step) first seen within
    twice the sightings a confirmation takes (noise hides a small offset now and then). One
    rank far slower from the start alone is still reported, as a warning."""
    early = 0 <= e.onset - state.first_step <= 2 * _sightings_needed(cfg, state.n_ranks, e.level)
    modest = e.hits > 0 and e.added_ms_sum / e.hits <= cfg.baseline_max_frac * sf.step_ms
    if early and modest:
        return True
    since_start = sum(
        1
        for o in state.episodes.values()
        if o is not e and o.level == e.level and o.onset - state.first_step <= cfg.persistent_within
    )
    return e.persistent and since_start >= 2


def _deepen_late(state: JobState, step: int, deepen: Deepen) -> list[Anomaly]:
    """Another try at the kernel level for confirmed episodes it has not explained yet and
    not reported this step: the anomalies it explained now."""
    out = []
    for e in state.episodes.values():
        if e.emitted and e.deepen_left > 0 and e.reported != step and _deepen(e, deepen):
            e.reported = step
            out.append(_anomaly(state, e))
    return out


def _unsighted(
    state: JobState, seen: set[str], weak: set[int], verdict: IterationVerdict, cfg: DiagnoserConfig
) -> list[Anomaly]:
    """Episodes not sighted this step wait one step more, or close: a confirmed one still near
    its threshold stays open (hysteresis: its window ends at its last clear sighting); one
    past its patience closes (its final anomaly, or a transient); one of a rank slow every
    k-th step stays open while its spikes keep their rhythm. The anomalies closed."""
    out = []
    changing = {int(r) for r in np.flatnonzero(state.changes.period[0] >= 0)}
    for key, e in list(state.episodes.items()):
        if key in seen:
            continue
        if e.emitted and (_near(e, weak, verdict, cfg) or (e.change_onset >= 0 and changing & set(e.ranks))):
            e.idle = 0
            continue
        e.idle += 1
        if e.idle > _patience(e, cfg):
            state.episodes.pop(key)
            out += _close(state, key, e, cfg)
    return out


def _close(state: JobState, key: str, e: Episode, cfg: DiagnoserConfig) -> list[Anomaly]:
    """A closed episode: its final anomaly, kept a while to be continued if the same fault
    comes back (a one-off or persistent one aside); an unconfirmed one counts as a transient."""
    if not e.emitted:
        _count_transient(state, e.suspect, cfg)
        return []
    if e.reported == _SILENT:
        return []
    if e.cause not in ONE_OFF_CAUSES and not e.persistent:
        state.closed[key] = e
        if len(state.closed) > cfg.max_open:
            del state.closed[min(state.closed, key=lambda k: state.closed[k].last_seen)]
    return [_anomaly(state, e)]


def _forget_stale(state: JobState, cfg: DiagnoserConfig) -> None:
    """At most ``max_open`` episodes: the unconfirmed ones seen longest ago go."""
    if len(state.episodes) > cfg.max_open:
        stale = sorted((e.last_seen, k) for k, e in state.episodes.items() if not e.emitted)
        for _, k in stale[: len(state.episodes) - cfg.max_open]:
            state.episodes.pop(k)


_GROUP_KINDS = ("host", "link", "ranks")


def _deepen(e: Episode, deepen: Deepen) -> bool:
    """One try at the kernel level for a confirmed episode: True when its kernels or stacks
    explained it now (its level becomes ``kernel``; no more tries), else one try fewer; no
    data yet (its sketches late, or not collected) costs no try."""
    found = deepen(e.ranks[:3], e.peers, e.onset)
    if found is None:
        return False
    e.deepen_left -= 1
    e.evidence.update(found.evidence)
    if not found.explained:
        return False
    e.level, e.detail, e.deepen_left = "kernel", found.summary, 0
    return True


def _recurring(state: JobState, key: str, e: Episode, cfg: DiagnoserConfig) -> Episode | None:
    """The anomaly of ``key`` that closed lately, if ``e`` (just confirmed) is that fault
    back: a flapping rank, a job-wide change that wavers about its threshold. It came within
    ``recur_within`` steps and within twice the last stretch. Forgets what closed too long
    ago."""
    for k, was in list(state.closed.items()):
        if e.onset - was.last_seen > cfg.recur_within:
            del state.closed[k]
    old = state.closed.get(key)
    if old is None or e.onset - old.last_seen > 2 * (old.last_seen - old.onset + 1):
        return None
    return state.closed.pop(key)


def _continue(old: Episode, e: Episode, cfg: DiagnoserConfig) -> Episode:
    """``old`` (an anomaly closed lately) taking in ``e``, the same fault back: one anomaly,
    its id and onset kept, its window, sightings and cost grown."""
    old.last_seen, old.idle = e.last_seen, 0
    old.hits += e.hits
    old.hits_at = [*old.hits_at, *e.hits_at][-8:]
    old.added_ms_sum += e.added_ms_sum
    old.gpu_hours += e.gpu_hours
    if e.score >= old.score:
        old.score = e.score
        old.evidence.update(e.evidence)
    old.ranks = sorted(set(old.ranks) | set(e.ranks))[: cfg.max_listed]
    return old


def _patience(e: Episode, cfg: DiagnoserConfig) -> int:
    """Steps without a sighting before an episode closes: longer for a straggler since the
    start, and for a confirmed fault seen every few steps (a flapping rank) twice its
    typical gap."""
    if e.persistent:
        return cfg.persistent_close_after
    if not e.emitted or e.hits < 2:
        return cfg.close_after
    gap = (e.last_seen - e.onset) / (e.hits - 1)
    return int(min(max(cfg.close_after, np.ceil(2.0 * gap)), 4 * cfg.close_after))


def _split(
    f: Finding, groups: Mapping[tuple[str, int], str], state: JobState, cfg: DiagnoserConfig
) -> list[Finding]:
    """A host or multi-rank finding whose ranks already have confirmed episodes of their
    own (another fault, found earlier) gives those ranks back to them; what is left stays a
    group when large enough, else becomes per-rank findings."""
    if f.suspect_kind not in ("host", "ranks"):
        return [f]
    fam = _family(f.cause)
    taken = []
    for r in f.ranks:
        k = groups.get((fam, r))
        if k is not None and k != f.key and (state.episodes[k].emitted or state.episodes[k].persistent):
            taken.append(r)
    if not taken:
        return [f]
    rest = [r for r in f.ranks if r not in taken]
    out = [_as_rank(f, r) for r in taken]
    if len(rest) >= cfg.host_min_ranks or (rest and f.key in state.episodes):
        out.append(dataclasses.replace(f, ranks=tuple(rest)))
    else:
        out.extend(_as_rank(f, r) for r in rest)
    return out


def _as_rank(f: Finding, r: int) -> Finding:
    return dataclasses.replace(f, suspect_kind="rank", suspect=f"rank:{r}", ranks=(r,))


def _near(e: Episode, weak: set[int], verdict: IterationVerdict, cfg: DiagnoserConfig) -> bool:
    """Whether a confirmed episode not sighted this step is still near its threshold: half
    of its ranks weakly flagged, or for a job-level one the step time half as far out."""
    if e.cause in ONE_OFF_CAUSES:
        return False
    if e.level == "iteration":
        return verdict.near(cfg.weak_frac)
    return bool(weak) and 2 * sum(r in weak for r in e.ranks) >= len(e.ranks) > 0


def _settle(state: JobState, verdict: IterationVerdict, cfg: DiagnoserConfig) -> bool:
    """Whether the job's warm-up ended, ``min_steps`` steps ago: early in its life, nothing
    confirmed yet, its steps have been ``global_ratio`` times faster than its baseline was
    when they began, ``min_steps`` steps in a row; from there "slow since the start" counts.
    A noisy job's short steps dip that far for a step or two: taken for the end of a warm-up,
    a fault that began just after a dip would be called "since the start" and never page.
    The reference stays the baseline before the run (the baseline itself soon follows the
    faster steps). A warm-up ends once: a job whose steps alternate between two speeds has
    such runs all its life."""
    early = (
        not state.settled
        and 0 < state.steps <= cfg.persistent_settle_steps
        and verdict.base_ms > 0
        and not any(e.emitted for e in state.episodes.values())
    )
    ref = state.fast_ref if state.fast_run else verdict.base_ms
    if early and verdict.step_ms * cfg.global_ratio <= ref:
        state.fast_run, state.fast_ref = state.fast_run + 1, ref
    else:
        state.fast_run = 0
    return state.fast_run == cfg.min_steps


def _explained(state: JobState, findings: Sequence[Finding], verdict: IterationVerdict) -> bool:
    """Whether the job's rise is the ranks' doing: a confirmed straggler is open, or one of
    this step's rank findings adds most of the rise (the step waits for its slowest rank)."""
    if any(
        e.emitted and e.level != "iteration" and e.cause not in ONE_OFF_CAUSES
        for e in state.episodes.values()
    ):
        return True
    rise = verdict.step_ms - verdict.base_ms
    return any(f.step_ms_added >= 0.8 * rise for f in findings)


def _family(cause: str) -> str:
    """Causes that are one fault seen two ways (a straggler whose time the timers see on
    some steps and not on others) share a family."""
    return COMPUTE_STRAGGLER if cause == MASKED_COMPUTE_STRAGGLER else cause


def _group_index(state: JobState) -> dict[tuple[str, int], str]:
    """(cause family, rank) -> key of the open episode the rank belongs to (a host or link
    episode before a rank's own). Ranks of a group across hosts belong to it once it is
    confirmed: before, they are whichever ranks a step flagged, and noise that moves about
    a large group would add up to one sustained fault. The same for a host before it is
    confirmed: a blip of one of its ranks is no sighting of the host."""
    out: dict[tuple[str, int], str] = {}
    for k, e in sorted(state.episodes.items(), key=lambda kv: kv[1].suspect_kind in _GROUP_KINDS):
        if k.endswith("|change"):  # a change from a baseline: its own test's sightings only
            continue
        if e.suspect_kind not in ("ranks", "host") or e.emitted:
            out.update({(_family(e.cause), r): k for r in e.ranks})
    return out


def _route(f: Finding, groups: Mapping[tuple[str, int], str]) -> str:
    """The episode a finding adds to: the open episode of its ranks (same cause family),
    else its own."""
    if f.decided_by == CHANGE_FIGURE:  # a change of ranks that already have an episode adds to it
        members = set(f.ranks)  # whatever the step's classifier named it: it saw the phases
        return next((k for (_, r), k in groups.items() if r in members), f.key)
    if f.suspect_kind in ("rank", "link", "host"):
        for r in f.ranks:
            key = groups.get((_family(f.cause), r))
            if key is not None and (f.suspect_kind != "host" or key.endswith(f"|{f.suspect}")):
                return key
    return f.key


def _absorb(state: JobState, key: str, group: Episode) -> None:
    """A new host or link episode takes over the open, unconfirmed episodes of its ranks
    (same cause family): the fault's onset is the earliest sighting of any of them."""
    fam = _family(group.cause)
    members = set(group.ranks)
    for k, e in list(state.episodes.items()):
        if k == key or e.emitted or _family(e.cause) != fam or not set(e.ranks) <= members:
            continue
        if e.suspect_kind not in ("rank", "link"):
            continue
        state.episodes.pop(k)
        group.onset = min(group.onset, e.onset)
        group.hits = max(group.hits, e.hits)
        group.persistent = group.persistent or e.persistent


def _open(f: Finding, step: int) -> Episode:
    return Episode(
        f.cause, f.level, f.suspect_kind, f.suspect, list(f.ranks), step, step, 0, False,
        f.score, f.decided_by, dict(f.evidence), 0.0, 0.0,
    )  # fmt: skip


def _onset(e: Episode) -> int:
    """Where a confirmed fault began: its first sighting, less leading ones a wider gap
    apart than its sightings since (a blip just before the fault is not its start; a
    flapping rank's regular gaps are kept)."""
    at = [a for a in e.hits_at if a >= e.onset]
    if len(at) < 3 or at[0] != e.onset:
        return e.onset
    gaps = np.diff(at)
    typical = float(np.median(gaps[1:]))
    i = 0
    while i < len(gaps) - 1 and gaps[i] > typical:
        i += 1
    return int(at[i])


def _drop_before_onset(e: Episode) -> None:
    """The sightings before a confirmed episode's onset (blips that were not the fault yet)
    leave its count, and their share of its cost with them (severity is decided on all)."""
    before = sum(1 for a in e.hits_at if a < e.onset)
    if before and e.hits > before:
        keep = (e.hits - before) / e.hits
        e.hits -= before
        e.added_ms_sum *= keep
        e.gpu_hours *= keep


def _persistent(e: Episode, state: JobState, cfg: DiagnoserConfig) -> bool:
    """Slow since the job's start (decided when confirmed): seen before the job settled
    after its warm-up, or within ``persistent_within`` steps of it."""
    return (
        e.level == "cross_rank"
        and e.cause not in ONE_OFF_CAUSES
        and state.first_step >= 0
        and e.onset - state.first_step <= cfg.persistent_within
    )


def _sightings_needed(cfg: DiagnoserConfig, n_ranks: int, level: str = "cross_rank") -> int:
    """Sightings that make a sustained fault: ``min_steps``, twice that for a rank of a job
    under ``group_min_size`` ranks (a few ranks' spread is a poor yardstick for one step's
    noise)."""
    return cfg.min_steps * (2 if level != "iteration" and n_ranks < cfg.group_min_size else 1)


def _confirmed(e: Episode, added: float, base_ms: float, cfg: DiagnoserConfig, n_ranks: int) -> bool:
    """Sustained, or a one-off stall that cost enough in one step (rank level, or a slow
    checkpoint): a few small pauses do not add up to a stall."""
    if e.hits >= _sightings_needed(cfg, n_ranks, e.level) or e.change_onset >= 0:
        return True
    one_off = e.cause in ONE_OFF_CAUSES and (e.level != "iteration" or e.cause == CHECKPOINT_STALL)
    return one_off and added >= cfg.min_cost_frac * base_ms


def _severity(e: Episode, cfg: DiagnoserConfig, page_hits: int, step_ms: float = 0.0) -> str:
    """page: an incident a person should act on now, seen in ``page_hits`` steps, or adding
    ``page_cost_frac`` of a ``step_ms`` step per sighting once confirmed (or a change
    point's); warn: worth a look, never a page (a straggler since the start, a one-off
    stall, a layout or workload imbalance), or not yet one (a small fault seen in fewer
    steps: noise that runs in streaks confirms a few steps and ends)."""
    if e.persistent or e.cause in _WARN_CAUSES or e.hits < 1:
        return "warn"
    costly = (
        step_ms > 0 and e.hits >= cfg.min_steps and e.added_ms_sum / e.hits >= cfg.page_cost_frac * step_ms
    )
    return "page" if e.hits >= page_hits or costly or e.change_onset >= 0 else "warn"


def _page_hits(cfg: DiagnoserConfig, n_ranks: int, level: str) -> int:
    """Sightings that make a confirmed fault a page: ``page_after`` times those that confirm it."""
    return math.ceil(cfg.page_after * _sightings_needed(cfg, n_ranks, level))


def _escalate(state: JobState, e: Episode, sf: StepFindings, cfg: DiagnoserConfig) -> Anomaly | None:
    """A confirmed warning that has now been seen long enough to page: sent again at once as
    a page (a page never turns back into a warning)."""
    if e.severity == "page" or e.reported == _SILENT or not e.emitted:
        return None
    if _severity(e, cfg, _page_hits(cfg, state.n_ranks, e.level), sf.step_ms) != "page":
        return None
    e.severity, e.reported = "page", sf.step
    return _anomaly(state, e)


def _count_transient(state: JobState, suspect: str, cfg: DiagnoserConfig) -> None:
    if suspect in state.transients or len(state.transients) < cfg.max_open:
        state.transients[suspect] = state.transients.get(suspect, 0) + 1


def refresh(state: JobState, deepen: Deepen | None = None) -> list[Anomaly]:
    """The current version of every confirmed anomaly whose window grew since it was last
    sent: for a job that stopped sending steps (it ended, or hangs), so that its anomalies'
    windows and costs are right without waiting for steps that will not come. ``deepen``
    gives the kernel level another try at every confirmed episode it has not explained yet
    (its sketches came after the job's last step); one it explains now is in the list too,
    ``level="kernel"``. Updates ``state`` (what was sent)."""
    out = []
    for e in state.episodes.values():
        if not e.emitted:
            continue
        explained = deepen is not None and e.level != "kernel" and e.deepen_left > 0 and _deepen(e, deepen)
        if e.reported < e.last_seen or explained:
            e.reported = e.last_seen
            out.append(_anomaly(state, e))
    return out


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
    sf, _ = _cross_rank_stage(batch, cfg, ())
    res = step_residuals(batch, cfg) if cfg.change_points else None
    if kernels is None and stacks is None:
        return apply_findings(state, sf, cfg, residuals=res)

    def deepen(suspects: Sequence[int], peers: Sequence[int], since: int) -> Deepening | None:
        ranks = [*suspects, *peers]  # this step's data, which is past ``since``
        return deepen_ranks(
            suspects,
            peers,
            kernels(ranks) if kernels is not None else {},
            stacks(ranks) if stacks is not None else {},
            names,
            cfg,
        )

    return apply_findings(state, sf, cfg, deepen=deepen, residuals=res)


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

    def flush(self, deepen: Deepen | None = None) -> list[Anomaly]:
        """Close every open episode (the end of the job): the final version of each confirmed
        one. A record shorter than ``min_steps`` (a profiler trace of two steps) confirms an
        episode seen in every one of its steps; ``deepen`` gives the kernel level one last
        try at every confirmed rank, link or host episode it has not explained yet."""
        st, cfg = self.state, self.config
        out = []
        for e in st.episodes.values():
            need = _sightings_needed(cfg, st.n_ranks, e.level)
            if not e.emitted and 0 < st.steps < need and e.hits >= st.steps:
                e.emitted, e.severity, e.detected_ns = True, _severity(e, cfg, st.steps), st.last_end_ns
            if e.emitted and deepen is not None and e.level != "kernel" and e.suspect_kind in _DEEP_KINDS:
                _deepen(e, deepen)
            if e.emitted and e.reported != _SILENT:
                out.append(_anomaly(st, e))
        st.episodes.clear()
        return out


def diagnose(
    batches: Iterable[StepBatch],
    config: DiagnoserConfig | None = None,
    *,
    job: str | None = None,
    run: int = 0,
    deepen: Deepen | None = None,
) -> list[Anomaly]:
    """Diagnose a whole run offline: the final version of every anomaly, by onset.

    ``deepen``: the kernel level over the run's kernel sketches and stacks (e.g.
    ``streams.deepening.EvidenceHistory.deepener`` fed with what ``import-trace`` read),
    as in the stream worker.
    """
    diag: JobDiagnoser | None = None
    final: dict[str, Anomaly] = {}
    for b in batches:
        if diag is None:
            diag = JobDiagnoser(job or b.job, b.run if job is None else run, config)
        res = apply_findings(
            diag.state,
            step_findings(b, diag.config),
            diag.config,
            deepen=deepen,
            residuals=step_residuals(b, diag.config) if diag.config.change_points else None,
        )
        for a in res.anomalies:
            final[a.id] = a
    if diag is not None:
        for a in diag.flush(deepen):
            final[a.id] = a
    return sorted(final.values(), key=lambda a: (a.start_step, a.cause, a.suspect))
