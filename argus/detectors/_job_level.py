"""The iteration level of the temporal half: one step against the job's baseline (its
warm-up's end, global steps, the job's own finding when no rank explains a rise), the
baseline followed, and the ranks' change points folded in."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from argus.schemas import StepFindings
from argus.schemas.causes import MASKED_COMPUTE_STRAGGLER, ONE_OFF_CAUSES

from ._baselines import _settle
from ._config import DiagnoserConfig
from ._finding import Finding
from ._routing import _confirmed_open, _group_index, group_change, remembered
from ._state import _SILENT, Episode, JobState
from .changepoint import ChangeState, RankResiduals, job_beat, stirring, track
from .common_cause import cause_findings
from .iteration import (
    IterationVerdict,
    attribute,
    follow_pace,
    is_global_step,
    iteration_level,
    update_baseline,
)


def job_level(
    state: JobState, sf: StepFindings, cfg: DiagnoserConfig
) -> tuple[IterationVerdict, list[Finding], bool]:
    """The iteration level of one step: its verdict against the job's baseline, the step's
    findings (without the rank ones on a global step; with the job's own when no rank
    explains a rise) and whether the step is global; the baseline and step counts updated."""
    step = sf.step
    job_ms = (sf.job_ms if sf.job_ms >= 0 else sf.step_ms) * _as_if_all(state, sf, cfg)
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
    glob = _every_rank_slow(state, sf, cfg)
    state.global_run = state.global_run + 1 if glob else 0
    if state.global_run == 1 and step >= cfg.warmup_steps:
        job_beat(state.changes, step)
    if glob:  # no new rank episode; a confirmed one its rank still stands out in goes on
        groups = _group_index(state)
        findings = [f for f in findings if f.level != "cross_rank" or _confirmed_open(state, f, groups)]
    # an evaluation or a checkpoint is a few global steps; the whole job slow for longer is news
    sustained = state.global_run > 2 * cfg.min_steps
    if (
        step >= cfg.warmup_steps
        and (sustained or not glob)
        and (job := attribute(verdict, cfg)) is not None
        and not _explained(state, findings, verdict, cfg)
    ):
        findings.append(job)
    if not glob:
        _follow_baseline(state, sf, verdict, cfg)
    return verdict, findings, glob


def _as_if_all(state: JobState, sf: StepFindings, cfg: DiagnoserConfig) -> float:
    """The factor that makes a step's job time what it would be had every rank reported:
    a step of a small job or log that lacks some of its ranks is the time of those it holds,
    their known levels against their peers (their own baselines) taken out. Workers on
    their own clocks end a log at different times, and its last windows, only the slower
    workers', paged the job (1 if every rank reported, or too few levels are known)."""
    res, ch = sf.residuals, state.changes
    if res is None or not cfg.change_points or len(res.ranks) >= ch.n_ranks or ch.n_ranks >= cfg.small_job:
        return 1.0
    known = ch.n[0] >= cfg.cp_learn
    here = res.ranks[(res.ranks < ch.n_ranks)]
    here = here[known[here]]
    if known.sum() < 4 or not len(here):
        return 1.0
    return float(np.exp(np.median(ch.base[0, known]) - np.median(ch.base[0, here])))


def _every_rank_slow(state: JobState, sf: StepFindings, cfg: DiagnoserConfig) -> bool:
    """Whether the step is global (:func:`iteration.is_global_step`): the typical rank's
    work, and where the ranks' own works travel the fast quarter's too, ``global_ratio``
    times its reference or more. The typical rank of a small job is half its ranks: two of
    four workers 3.5x slower on every other step made those steps global, where no rank
    can stand out, and the fault went unseen."""
    if not is_global_step(state.iteration, sf.job_median, cfg.global_ratio):
        return False
    res = sf.residuals
    if res is None or len(res.lw) < 2:
        return True
    fast = float(np.exp(np.quantile(res.lw, _FAST_Q)))
    return fast >= cfg.global_ratio * state.iteration.work_ref_ms


_FAST_Q = 0.25
"""The quantile of the ranks' own work that is the fast side (:func:`_every_rank_slow`)."""


def with_changes(
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
        findings = [f for f in findings if not own_past_silent(ch, f, cfg)]
    # a whole stage slower than the others is the stage's finding (the layout's), not its ranks'
    stages = {f.suspect for f in findings if f.suspect_kind == "stage"}
    changes = [f for f in cause_findings(ch, res, cfg) if f.suspect not in stages]
    # a rank of ranks that changed together is that cause's, not an episode of its own (a
    # log without hosts: two hosts flapping were 92 anomalies, one per rank per flap)
    together = {r for f in changes if len(f.ranks) > 1 for r in f.ranks}
    # and while their closed change is remembered (:func:`remembered`): a flapping group's ranks
    # stand out a few steps before its change opens again, and that is the group back
    together.update(
        r
        for e in state.closed.values()
        if group_change(e) and sf.step - e.last_seen <= remembered(e, cfg)
        for r in e.ranks
    )
    findings = [
        f
        for f in findings
        if not (f.level == "cross_rank" and f.suspect_kind == "rank" and together.intersection(f.ranks))
    ]
    return [*findings, *changes]


_NOT_OWN_WORK = ONE_OFF_CAUSES | {MASKED_COMPUTE_STRAGGLER}
"""Causes of a rank finding its own work's change points do not speak for."""


def own_past_silent(
    ch: ChangeState,
    f: Finding | Episode,
    cfg: DiagnoserConfig,
    kinds: tuple[str, ...] = ("rank",),
    learning: bool = False,
) -> bool:
    """Whether a rank's finding (or episode) of its peers is one its own past does not
    bear out: its change points have learned it and show no change (a masked straggler is
    told by its peers' wait, not by its own work; a one-off is no change), or, with
    ``learning``, are still learning it (no change known yet). With ``kinds`` holding
    ``ranks``, the same for ranks found together: none of theirs shows a change."""
    if f.level != "cross_rank" or f.suspect_kind not in kinds or f.cause in _NOT_OWN_WORK:
        return False
    if not f.ranks:  # (a hostile finding: the temporal stage's own checks have it)
        return False
    return all(ch.silent(r, cfg.cp_learn) or (learning and ch.learning(r, cfg.cp_learn)) for r in f.ranks)


def _explained(
    state: JobState, findings: Sequence[Finding], verdict: IterationVerdict, cfg: DiagnoserConfig
) -> bool:
    """Whether the job's rise is the ranks' doing: a confirmed straggler is open, one of
    this step's rank findings adds most of the rise (the step waits for its slowest rank),
    or a rank's own change is open or building (:func:`changepoint.stirring`)."""
    if any(
        e.emitted and e.reported != _SILENT and e.level != "iteration" and e.cause not in ONE_OFF_CAUSES
        for e in state.episodes.values()
    ):
        return True
    rise = verdict.step_ms - verdict.base_ms
    if any(f.step_ms_added >= 0.8 * rise for f in findings):
        return True
    return cfg.change_points and stirring(state.changes, cfg)


def _follow_baseline(
    state: JobState, sf: StepFindings, verdict: IterationVerdict, cfg: DiagnoserConfig
) -> None:
    """The baseline stands still while a fault is confirmed. Until then every step goes into
    its ring (where a share of steps is slow on every rank, that is the job's pace), but an
    anomalous one not into the phase reference a rise is attributed against. A job-wide
    change that lasted ``iter_adopt_steps`` is taken in as the job's new level (a schedule or
    data change, a permanent loss): its anomaly closes as the baseline catches up. While
    a rank's or group's fault stands, the baseline follows the job's pace
    (:func:`follow_pace`)."""
    emitted = [e for e in state.episodes.values() if e.emitted and e.reported != _SILENT]  # not baselines
    adopting = any(e.level == "iteration" and sf.step - e.onset >= cfg.iter_adopt_steps for e in emitted)
    if adopting or not emitted:
        update_baseline(
            state.iteration, verdict, sf.step, sf.job_median, cfg, phases=adopting or not verdict.anomalous
        )
    elif all(e.level != "iteration" for e in emitted) and sf.step >= cfg.warmup_steps:
        follow_pace(state.iteration, sf.job_median)
