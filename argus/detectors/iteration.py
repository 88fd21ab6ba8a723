"""Iteration level: anomalous windows of a job from its step time (robust change detection).

The state is a ring of the last clean steps' job step time (median over ranks, checkpoint
time excluded) and an exponentially weighted reference of the job's phase medians, so a
rise can be attributed to the phase that rose. Warm-up and checkpoint steps never alarm
and never enter the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from argus.schemas.causes import (
    CHECKPOINT_STALL,
    DATALOADER_STALL,
    GC_PAUSE,
    JIT_COMPILE_STALL,
    LINK_DEGRADATION,
    PIPELINE_BUBBLE,
    UNKNOWN,
)

from ._config import DiagnoserConfig
from ._finding import Finding
from ._robust import MAD_TO_SIGMA
from .cross_rank import METRICS, OWN_WORK

__all__ = [
    "JOB_METRICS",
    "IterationState",
    "IterationVerdict",
    "attribute",
    "is_global_step",
    "iteration_level",
    "job_work_ms",
    "update_baseline",
]

JOB_METRICS: tuple[str, ...] = (
    "compute_ms",
    "dataloader_ms",
    "h2d_ms",
    "gc_ms",
    "compile_ms",
    "all_reduce_ms",
    "gather_scatter_ms",
    "all_to_all_ms",
    "p2p_ms",
)
"""Phases a job-wide rise is attributed to (job medians, see CrossRankResult.job_median)."""
_ROWS = np.array([METRICS.index(m) for m in JOB_METRICS])
_CAUSE = {
    "compute_ms": (UNKNOWN, "job"),
    "dataloader_ms": (DATALOADER_STALL, "job"),
    "h2d_ms": (DATALOADER_STALL, "job"),
    "gc_ms": (GC_PAUSE, "job"),
    "compile_ms": (JIT_COMPILE_STALL, "job"),
    "all_reduce_ms": (LINK_DEGRADATION, "network"),
    "gather_scatter_ms": (LINK_DEGRADATION, "network"),
    "all_to_all_ms": (LINK_DEGRADATION, "network"),
    "p2p_ms": (PIPELINE_BUBBLE, "pipeline"),
}
_ALPHA = 0.2
_HIGH_Q = 0.95
_BASE_STEPS = 8
"""Clean steps that make a baseline (the end of a warm-up shows against it); a step is
anomalous only once ``iter_min_steps`` show how the job's pace varies."""
_RECENT = 8
"""The newest steps of the ring, left out of its quantiles (they may be a fault's first)."""


@dataclass
class IterationState:
    """Per-job iteration baseline (small, plain data): ring of clean job step times,
    the count of clean steps seen, the reference job phase medians (``JOB_METRICS``
    order), the last clean checkpoint's median duration and the reference of the typical
    rank's own work (:func:`job_work_ms`)."""

    window: np.ndarray = field(default_factory=lambda: np.zeros(32))
    n: int = 0
    ref: np.ndarray = field(default_factory=lambda: np.zeros(len(JOB_METRICS)))
    ckpt_ref_ms: float = 0.0
    work_ref_ms: float = 0.0


@dataclass(frozen=True)
class IterationVerdict:
    """The iteration-level figures of one step: the job step time, its baseline, the
    robust z of the difference, whether it is anomalous, and each job phase's rise."""

    step_ms: float
    base_ms: float
    z: float
    anomalous: bool
    rise: np.ndarray
    checkpoint: bool
    checkpoint_ms: float
    checkpoint_ratio: float
    threshold_ms: float = 0.0
    """The step time from which a step is anomalous (0 while the baseline is not ready)."""

    def near(self, frac: float) -> bool:
        """Whether the step time is ``frac`` of the way from the baseline to the threshold."""
        return self.threshold_ms > 0 and self.step_ms - self.base_ms >= frac * (
            self.threshold_ms - self.base_ms
        )


def iteration_level(
    state: IterationState,
    step: int,
    job_step_ms: float,
    job_median: np.ndarray,
    config: DiagnoserConfig | None = None,
) -> IterationVerdict:
    """Whether the job's step time of ``step`` left its baseline.

    Args:
        state: the job's iteration state (read only here).
        step: the step number (warm-up steps are never anomalous).
        job_step_ms: the median step wall time over ranks.
        job_median: per METRICS, the job's median (``CrossRankResult.job_median``).
        config: ``iter_*``, ``warmup_steps``, ``checkpoint_ratio``.
    """
    cfg = config or DiagnoserConfig()
    ckpt = float(job_median[METRICS.index("checkpoint_ms")])
    is_ckpt = ckpt > 0.0
    x = job_step_ms - ckpt
    rise = job_median[_ROWS] - state.ref
    k = min(state.n, len(state.window))
    if k < _BASE_STEPS or step < cfg.warmup_steps:
        return IterationVerdict(x, x, 0.0, False, rise, is_ckpt, ckpt, 0.0)
    w = state.window[:k]
    if k - _RECENT >= _BASE_STEPS:  # the newest steps may be a fault's first: not a yardstick yet
        keep = np.ones(k, dtype=bool)
        keep[(state.n - 1 - np.arange(_RECENT)) % len(state.window)] = False
        w = w[keep]
    base, high = (float(v) for v in np.quantile(w, (0.5, _HIGH_Q)))
    sigma = max(MAD_TO_SIGMA * float(np.median(np.abs(w - base))), 1e-3 * base, 1e-6)
    z = (x - base) / sigma
    # Above the baseline's own high steps as well: where a share of steps is slow on every
    # rank (long sequences, a periodic extra), the MAD sees only the fast majority.
    threshold = max(base + cfg.iter_z * sigma, max(base, high) + cfg.iter_rel * base)
    ratio = ckpt / state.ckpt_ref_ms if is_ckpt and state.ckpt_ref_ms > 0 else 0.0
    anomalous = k >= cfg.iter_min_steps and x >= threshold
    return IterationVerdict(x, base, float(z), anomalous, rise, is_ckpt, ckpt, ratio, threshold)


def update_baseline(
    state: IterationState,
    verdict: IterationVerdict,
    step: int,
    job_median: np.ndarray,
    config: DiagnoserConfig | None = None,
    *,
    phases: bool = True,
) -> None:
    """Fold a step into the baseline: its step time into the ring whose spread the test
    uses, and with ``phases`` its phase medians into the reference a rise is attributed
    against (not for an anomalous step: a fault's first steps would move it)."""
    cfg = config or DiagnoserConfig()
    if step < cfg.warmup_steps:
        return
    if verdict.checkpoint:
        state.ckpt_ref_ms = verdict.checkpoint_ms
        return
    w = len(state.window)
    state.window[state.n % w] = verdict.step_ms
    vals = job_median[_ROWS]
    work = job_work_ms(job_median)
    if state.n == 0:
        state.ref, state.work_ref_ms = vals.copy(), work
    elif phases:
        state.ref = (1 - _ALPHA) * state.ref + _ALPHA * vals
        state.work_ref_ms = (1 - _ALPHA) * state.work_ref_ms + _ALPHA * work
    state.n += 1


def follow_pace(state: IterationState, job_median: np.ndarray) -> None:
    """While a rank's or group's fault holds the step time up (the baseline stands still),
    the baseline still follows the job's pace: its ring, phase reference and work
    reference scaled by the typical rank's work (EW, as the reference follows it). A job
    whose steps drifted 8 % through a host's fault was paged as a whole once the fault
    ended, against the step time from before it."""
    work = job_work_ms(job_median)
    if state.n == 0 or state.work_ref_ms <= 0 or not np.isfinite(work) or work <= 0:
        return
    new = (1 - _ALPHA) * state.work_ref_ms + _ALPHA * work
    f = new / state.work_ref_ms
    state.window *= f
    state.ref = state.ref * f
    state.work_ref_ms = new


_WORK = np.array([METRICS.index(m) for m in OWN_WORK])


def job_work_ms(job_median: np.ndarray) -> float:
    """The typical rank's own work in a step (ms): its phases and its time outside every
    timer, without collectives (which hold the wait for a straggler) or a checkpoint."""
    return float(job_median[_WORK].sum())


def is_global_step(state: IterationState, job_median: np.ndarray, ratio: float) -> bool:
    """Whether every rank works ``ratio`` times its reference or more in this step
    (evaluation, an unannotated checkpoint, a warm-up): no rank can stand out there.
    One rank's stall leaves the typical rank's work, and so this, unchanged."""
    return state.work_ref_ms > 0 and job_work_ms(job_median) >= ratio * state.work_ref_ms


def attribute(verdict: IterationVerdict, config: DiagnoserConfig | None = None) -> Finding | None:
    """A job-level finding for an anomalous step no rank explains: the phase that rose most
    (the pipeline's send/recv -> bubble amplification; a collective -> the network; ...),
    or a checkpoint far slower than the last one."""
    cfg = config or DiagnoserConfig()
    if verdict.checkpoint and verdict.checkpoint_ratio >= cfg.checkpoint_ratio:
        ev = {
            "checkpoint_ms_ratio": round(verdict.checkpoint_ratio, 4),
            "checkpoint_ms": round(verdict.checkpoint_ms, 4),
        }
        added = verdict.checkpoint_ms * (1 - 1 / verdict.checkpoint_ratio)
        return Finding(
            CHECKPOINT_STALL,
            "iteration",
            "job",
            "checkpoint",
            (),
            verdict.checkpoint_ratio,
            "checkpoint_ms_ratio",
            ev,
            added,
        )
    if not verdict.anomalous:
        return None
    i = int(np.argmax(verdict.rise))
    metric = JOB_METRICS[i]
    cause, suspect = _CAUSE[metric]
    step_rise = verdict.step_ms - verdict.base_ms
    deciding = f"{metric}_rise"
    if verdict.rise[i] < 0.5 * step_rise:  # most of the rise is outside every phase timer
        cause, suspect, deciding = UNKNOWN, "job", "step_ms_rise"
    ev = {
        f"{metric}_rise": round(float(verdict.rise[i]), 4),
        "step_ms_rise": round(verdict.step_ms - verdict.base_ms, 4),
        "step_ms_z": round(min(verdict.z, 1e6), 4),
        "step_ms": round(verdict.step_ms, 4),
    }
    return Finding(
        cause,
        "iteration",
        "job",
        suspect,
        (),
        min(verdict.z, 1e6),
        deciding,
        ev,
        verdict.step_ms - verdict.base_ms,
    )
