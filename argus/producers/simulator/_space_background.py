"""The noise space's backgrounds: one job's noise (:class:`Background`), drawn at random from
the space's ranges (:func:`draw_background`), and the noise series it is built from
(:func:`_ar_series`). :mod:`._space` assembles a job from them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Background:
    """One job's noise, as drawn (see :func:`draw_background` for the ranges).

    Relative sizes are fractions of a rank's compute (``jitter``, ``shared_sd``,
    ``group_sd``, ``offset``) or of a healthy step (``blip``, ``spike``, ``gc``,
    ``ckpt``).
    """

    jitter: float
    """Robust SD of each rank's own per-step noise."""
    ar: float
    """Lag-1 autocorrelation of that noise (0: none, 0.95: strong)."""
    df: float
    """Student-t degrees of freedom of its innovations (inf: Gaussian; 1.5: very heavy)."""
    shared_sd: float
    """SD of the per-step factor every rank shares (data-dependent step times)."""
    shared_ar: float
    group_by: str
    """``dp`` (replicas) or ``pp`` (stages): the groups that share a second per-step factor."""
    group_sd: float
    offset: float
    """Static per-rank offsets, uniform in ±offset."""
    slow_group: float
    """A persistent speed group's factor (1: one speed for all)."""
    slow_share: float
    """Its share of the ranks (whole hosts where the job has several)."""
    blip_rate: float
    """Host-wide one-step blips per host-step."""
    blip: tuple[float, float]
    spike_rate: float
    """Single-rank one-step spikes per rank-step."""
    spike: tuple[float, float]
    warmup: int
    warmup_factor: float
    eval_every: int
    """Unannotated evaluation steps (every rank ``eval_factor`` times slower), 0: none."""
    eval_factor: float
    ckpt_every: int
    """Unannotated checkpoints (every rank ``ckpt`` steps longer, no timer sees it), 0: none."""
    ckpt: float
    gc_rate: float
    """GC pauses per rank-step (booked to the GC timer), ``gc`` of a step each."""
    gc: float
    missing: float
    """Share of rank-steps (rank-samples in a log) that never arrive."""
    annotated_ckpt_every: int
    """Checkpoints the agent times (``checkpoint_ms``), 0: none."""


def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def draw_background(rng: np.random.Generator) -> Background:
    """A job's background from the space's ranges (each component present or not, and how
    strong, drawn independently)."""
    on: Callable[[float], bool] = lambda p: bool(rng.random() < p)  # noqa: E731
    df_choice = rng.random()
    df = np.inf if df_choice < 0.3 else float(_loguniform(rng, 1.5, 30.0))
    return Background(
        jitter=_loguniform(rng, 0.005, 0.05),
        ar=0.0 if on(0.35) else float(rng.uniform(0.2, 0.95)),
        df=df,
        shared_sd=_loguniform(rng, 0.003, 0.08) if on(0.7) else 0.0,
        shared_ar=float(rng.uniform(0.0, 0.9)) if on(0.5) else 0.0,
        group_by=str(rng.choice(["dp", "pp"])),
        group_sd=_loguniform(rng, 0.003, 0.05) if on(0.5) else 0.0,
        offset=float(rng.uniform(0.0, 0.12)) if on(0.7) else 0.0,
        slow_group=float(_loguniform(rng, 1.1, 4.0)) if on(0.25) else 1.0,
        slow_share=float(rng.uniform(0.1, 0.5)),
        blip_rate=_loguniform(rng, 1e-4, 2e-3) if on(0.6) else 0.0,
        blip=(0.05, float(rng.uniform(0.1, 0.5))),
        spike_rate=_loguniform(rng, 1e-4, 0.01) if on(0.6) else 0.0,
        spike=(0.05, float(rng.uniform(0.1, 1.0))),
        warmup=int(rng.integers(0, 31)),
        warmup_factor=float(rng.uniform(1.2, 3.0)),
        eval_every=int(rng.integers(100, 400)) if on(0.4) else 0,
        eval_factor=float(rng.uniform(1.5, 6.0)),
        ckpt_every=int(rng.integers(100, 500)) if on(0.4) else 0,
        ckpt=float(rng.uniform(2.0, 20.0)),
        gc_rate=_loguniform(rng, 1e-4, 3e-3) if on(0.5) else 0.0,
        gc=float(rng.uniform(0.05, 0.5)),
        missing=_loguniform(rng, 1e-4, 0.03) if on(0.4) else 0.0,
        annotated_ckpt_every=int(rng.integers(50, 200)) if on(0.3) else 0,
    )


def _ar_series(rng: np.random.Generator, shape: tuple[int, int], phi: float, df: float) -> np.ndarray:
    """Unit robust-scale noise (steps × series): Student-t innovations, AR(1) ``phi``."""
    eps = rng.standard_normal(shape) if np.isinf(df) else rng.standard_t(df, shape)
    eps /= max(float(np.median(np.abs(eps))) / 0.6745, 1e-12)
    if phi <= 0.0:
        return eps
    out = np.empty_like(eps)
    out[0] = eps[0]
    c = np.sqrt(1.0 - phi * phi)
    for t in range(1, shape[0]):
        out[t] = phi * out[t - 1] + c * eps[t]
    return out
