"""A noise space: every job's background and faults drawn at random from wide ranges.

One generator is one set of figures a diagnosis can be tuned to. :func:`draw_job` draws a
job's size, layout, background and faults from ranges instead, per job and reproducibly
from a seed:

* **background** (:class:`Background`): each rank's own jitter (0.5-5 % robust SD,
  autocorrelation none to strong, tails Gaussian to very heavy), a per-step factor shared
  by every rank (data-dependent steps), a per-step factor shared by each data-parallel
  replica or pipeline stage, host-wide one-step blips, single-rank spikes, static per-rank
  offsets up to ±12 %, two persistent speed groups, warm-up, unannotated evaluation and
  checkpoint steps, GC pauses, missing samples;
* **size**: 1,024 ranks (several dp × tp × pp layouts) or 4-16 ranks; a small job's log
  may be sampled irregularly in time (one sample per rank every few steps, averaged);
* **faults** (:class:`SpaceFault`): magnitude, duration, shape (``step``, ``ramp``,
  ``sawtooth``, ``every_k``, ``flapping``) and who (a rank, a host, several hosts of a
  replica, a replica, a stage, or up to half of a small job).

Everything multiplies a rank's compute time (``factor``) or adds to its step
(``stall_ms``, ``spike_ms``, ``gc_ms``, ``ckpt_ms``). The same job is seen as a live job
(:meth:`SpaceJob.simulator`, the :class:`ClusterSimulator`'s step model and records) or as
a per-rank step log (:meth:`SpaceJob.log`, the rows ``argus diagnose --steps-csv`` reads).
The background is drawn in :mod:`._space_background`, the faults in :mod:`._space_faults`;
this module draws the size and assembles the job.

**Signal-to-noise ratio** of a fault (:meth:`SpaceJob.snr`): per culprit rank, the fault's
effect summed over its window against the rank's own residual noise, i.e. after the
factors shared per step and the static offsets are removed (the job's always; its replica's
or stage's where they can be: not on a log path, which names no groups, nor for a fault of
the whole replica or stage)::

    snr = sum_t (f_t - 1) / (sigma_r * sqrt(n * (1 + phi) / (1 - phi)))

with ``f_t`` the fault's factor on the rank's compute at step ``t`` of its window of ``n``
steps (1 where an every-k-th-step or flapping fault rests), ``sigma_r`` the robust SD
(1.4826 × MAD) of the rank's own relative noise and ``phi`` its lag-1 autocorrelation
(autocorrelated noise carries less evidence per step); for a constant shift ``delta`` this
is ``delta * sqrt(n) / sigma_eff``. A fault of several ranks has the median of its ranks'.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ._cluster import ClusterSimulator, PhaseTimes, SimStep, _Draft
from ._faults import Label
from ._layout import Layout
from ._noise import Noise
from ._space_background import Background, _ar_series, _loguniform, draw_background
from ._space_faults import SHAPES, WHO, SpaceFault, _fault_factor, _magnitude, _who

__all__ = [
    "BIG_LAYOUTS",
    "PATHS",
    "SHAPES",
    "WHO",
    "Background",
    "SpaceFault",
    "SpaceJob",
    "SpaceLog",
    "draw_background",
    "draw_job",
]

PATHS = ("live", "csv_steps", "csv_time")
"""How the diagnosis sees a job: the live engine's step batches, a step log with rank, step
and value only, or a log sampled irregularly in time (rank, time, value)."""
BIG_LAYOUTS = (
    Layout(dp=16, tp=8, pp=8),
    Layout(dp=32, tp=8, pp=4),
    Layout(dp=64, tp=8, pp=2),
    Layout(dp=128, tp=8, pp=1),
    Layout(dp=32, tp=4, pp=8),
    Layout(dp=8, tp=8, pp=16),
)
"""The 1,024-rank layouts a large job is drawn from."""

_P = PhaseTimes()
COMPUTE_MS = _P.forward + _P.backward + _P.optimizer
"""A healthy rank's compute per step (what ``factor`` multiplies), ms."""
STEP_MS = COMPUTE_MS + _P.dataloader + _P.h2d
"""A healthy rank's own work per step (compute, data loading, copies), ms: the unit of
blips, spikes and pauses, and the value a step log holds."""
_BASE_NOISE = Noise(
    phase_sd=0.002,
    jitter=0.0,
    offset=0.0,
    warmup=0,
    eval_every=0,
    ckpt_every=0,
    gc_rate=0.0,
)
"""What the cluster simulator adds itself under a space job: a little per-phase noise only
(everything else comes from the job's :class:`Background`)."""


@dataclass(frozen=True)
class SpaceLog:
    """A job as a per-rank log: rows (rank, t, value), whether ``t`` is a time, and per
    step the time its samples carry (to place a step in the log's windows)."""

    rank: np.ndarray
    t: np.ndarray
    value: np.ndarray
    by_time: bool
    step_t: np.ndarray


@dataclass
class SpaceJob:
    """One drawn job: layout, length, background, faults, how it is seen, and the arrays
    (steps × ranks) every step is built from."""

    seed: int
    layout: Layout
    steps: int
    background: Background
    faults: tuple[SpaceFault, ...]
    path: str
    sample_every: float
    """Steps per sample of a time-sampled log (1 otherwise)."""
    own: np.ndarray = field(repr=False)
    """Each rank's own relative noise (1 + x): what the SNR measures against."""
    group_noise: np.ndarray = field(repr=False)
    """The per-step factor each rank shares with its replica or stage (1: none)."""
    factor: np.ndarray = field(repr=False)
    """Everything that multiplies a rank's compute: own noise, shared factors, offsets, speed
    groups, warm-up, evaluation steps, faults."""
    stall_ms: np.ndarray = field(repr=False)
    spike_ms: np.ndarray = field(repr=False)
    gc_ms: np.ndarray = field(repr=False)
    ckpt_ms: np.ndarray = field(repr=False)
    """Per step, the unannotated checkpoint's wall time on every rank."""
    present: np.ndarray = field(repr=False)
    """Whether a rank's record of a step arrives."""

    @property
    def name(self) -> str:
        """The job's id."""
        return f"space-{self.seed}"

    @property
    def small(self) -> bool:
        """Whether the job has fewer than 32 ranks."""
        return self.layout.n_ranks < 32

    @property
    def labels(self) -> tuple[Label, ...]:
        """Ground truth of every fault."""
        return tuple(f.label() for f in self.faults)

    def busy_ms(self) -> np.ndarray:
        """Each rank's own work per step (steps × ranks), ms: what a step log holds."""
        extra = self.stall_ms + self.spike_ms + self.gc_ms + self.ckpt_ms[:, None]
        busy: np.ndarray = COMPUTE_MS * self.factor + (STEP_MS - COMPUTE_MS) + extra
        return busy

    def snr(self, fault: SpaceFault) -> float:
        """The fault's signal-to-noise ratio (module docstring): the median over its ranks.

        The residual is the rank's own noise; the factor its replica or stage shares per
        step is residual noise too where nothing can remove it: on a log path, which names
        no replica or stage, and for a fault of a whole replica or stage (no peer of the
        group is left to compare with)."""
        lo, hi = fault.first_step, fault.last_step + 1
        effect = float(np.sum(fault.factor[lo:hi] - 1.0))
        cols = list(fault.ranks)
        resid = np.log(self.own[:, cols])
        groups = self.layout.coords[self.background.group_by]
        whole = np.count_nonzero(np.isin(groups, groups[cols])) == len(cols)
        if self.path != "live" or whole:
            resid = resid + np.log(self.group_noise[:, cols])
        resid = resid - np.median(resid, axis=0)
        mad = np.median(np.abs(resid), axis=0)
        sigma = np.hypot(1.4826 * mad, _BASE_NOISE.phase_sd)
        # lag-1 autocorrelation, on residuals clipped at 3 robust SDs (tails would drown it)
        x = np.clip(resid, -3 * sigma, 3 * sigma)
        x = x - x.mean(axis=0)
        den = np.maximum(np.sum(x * x, axis=0), 1e-18)
        phi = np.clip(np.sum(x[1:] * x[:-1], axis=0) / den, 0.0, 0.99)
        sigma_eff = sigma * np.sqrt((hi - lo) * (1.0 + phi) / (1.0 - phi))
        return float(np.median(effect / sigma_eff))

    def simulator(self) -> ClusterSimulator:
        """The job as a live cluster simulator (records as the agent sends them)."""
        return _SpaceSimulator(self)

    def log(self, rng_seed: int | None = None) -> SpaceLog:
        """The job as a per-rank log without hosts: (rank, step, value) rows, or for a
        time-sampled job (rank, time in s, value) with each rank sampling every
        ~``sample_every`` steps at its own irregular moments, the value averaged over the
        steps since its last sample. Missing samples are dropped."""
        rng = np.random.default_rng([self.seed, 7] if rng_seed is None else rng_seed)
        busy = self.busy_ms()
        n_steps, n = busy.shape
        step_end = np.cumsum(np.median(busy, axis=1)) / 1e3  # s since the job's start
        if self.path != "csv_time":
            r, s = np.nonzero(self.present.T)  # rank-major order, like a per-rank file
            return SpaceLog(r, s.astype(float), busy[s, r], False, np.arange(n_steps, dtype=float))
        ranks, ts, vals = [], [], []
        k = self.sample_every
        csum = np.vstack([np.zeros((1, n)), np.cumsum(busy, axis=0)])
        for rank in range(n):
            gaps = np.maximum(1, np.round(k * rng.uniform(0.6, 1.4, int(2 * n_steps / k) + 4))).astype(int)
            at = int(rng.integers(0, max(int(k), 1))) + np.cumsum(gaps)
            at = at[at < n_steps]
            prev = np.concatenate([[-1], at[:-1]])
            mean = (csum[at + 1, rank] - csum[prev + 1, rank]) / (at - prev)
            keep = rng.random(len(at)) >= self.background.missing
            when = step_end[at] + rng.normal(0.0, 0.02 * k * STEP_MS / 1e3, len(at))
            ranks.append(np.full(int(keep.sum()), rank))
            ts.append(when[keep])
            vals.append(mean[keep])
        # a step's effect reaches the log with the next sample: about half an interval on
        step_t = step_end + 0.5 * k * np.median(np.diff(step_end)) if n_steps > 1 else step_end
        return SpaceLog(np.concatenate(ranks), np.concatenate(ts), np.concatenate(vals), True, step_t)


class _SpaceSimulator(ClusterSimulator):
    """The cluster simulator's step model under a :class:`SpaceJob`'s arrays."""

    def __init__(self, job: SpaceJob) -> None:
        super().__init__(
            job.layout,
            seed=job.seed,
            job=job.name,
            noise=_BASE_NOISE,
            checkpoint_every=job.background.annotated_ckpt_every,
        )
        self._space = job

    def _gpu_speed(self, step: int, extra: np.random.Generator) -> np.ndarray:
        base: np.ndarray = (
            super()._gpu_speed(step, extra) * self._space.factor[min(step, self._space.steps - 1)]
        )
        return base

    def _add_noise(self, d: _Draft, step: int, extra: np.random.Generator) -> None:
        super()._add_noise(d, step, extra)
        job = self._space
        if step >= job.steps:
            return
        d.dl = d.dl + job.stall_ms[step]
        d.fwd = d.fwd + job.spike_ms[step]
        d.gc = d.gc + job.gc_ms[step]
        d.hidden = d.hidden + job.ckpt_ms[step]

    def step(self, step: int) -> SimStep:
        """One step of every rank whose record arrives (missing samples dropped)."""
        s = super().step(step)
        if step < self._space.steps and not self._space.present[step].all():
            s = dataclasses.replace(s, batch=s.batch.take(np.flatnonzero(self._space.present[step])))
        return s


def _small_layout(rng: np.random.Generator) -> Layout:
    n = int(rng.integers(4, 17))
    per_host = int(rng.choice([g for g in (1, 2, 4, 8) if g <= n // 2] or [1]))
    if n % 2 == 0 and n >= 8 and rng.random() < 0.3:
        return Layout(dp=n // 2, pp=2, gpus_per_host=per_host)
    return Layout(dp=n, gpus_per_host=per_host)


def draw_job(
    seed: int,
    *,
    faulty: bool,
    size: str | None = None,
    path: str | None = None,
    n_faults: int | None = None,
    shape: str | None = None,
    background: Background | None = None,
) -> SpaceJob:
    """One job of the noise space, reproducible from ``seed``.

    Args:
        seed: everything random derives from it.
        faulty: inject faults (1, sometimes 2) or none (a quiet job).
        size: ``"big"`` (1,024 ranks) or ``"small"`` (4-16); drawn when None.
        path: one of :data:`PATHS`; drawn when None (a big job's log is never time-sampled).
        n_faults: how many faults (drawn: 1, or 2 one time in five).
        shape: every fault's shape (one of :data:`SHAPES`); drawn per fault when None.
        background: the job's noise instead of a drawn one.

    Raises:
        ValueError: an unknown size, path or shape.
    """
    if size not in (None, "big", "small"):
        raise ValueError(f"size must be 'big' or 'small', got {size!r}")
    if path not in (None, *PATHS) or shape not in (None, *SHAPES):
        raise ValueError(f"path must be one of {PATHS} and shape one of {SHAPES}, got {path!r}, {shape!r}")
    rng = np.random.default_rng([seed, 0x5A5E])
    u = rng.random()
    size = size or ("big" if u < 0.45 else "small")
    layout = BIG_LAYOUTS[int(rng.integers(0, len(BIG_LAYOUTS)))] if size == "big" else _small_layout(rng)
    u = rng.random()
    if size == "big":
        path = path or ("live" if u < 0.75 else "csv_steps")
    else:
        path = path or ("live" if u < 0.4 else "csv_time" if u < 0.8 else "csv_steps")
    sample_every = float(rng.uniform(2.0, 10.0)) if path == "csv_time" else 1.0
    if path == "csv_time":  # 150-400 samples per rank
        steps = int(sample_every * rng.integers(150, 401))
    else:
        steps = int(rng.integers(300, 601)) if size == "big" else int(rng.integers(300, 1501))
    bg = draw_background(rng)
    bg = background or bg
    n, c = layout.n_ranks, layout.coords

    own = 1.0 + bg.jitter * _ar_series(rng, (steps, n), bg.ar, bg.df)
    own = np.clip(own, 0.5, 3.0)
    factor = own.copy()
    if bg.shared_sd > 0:
        z = _ar_series(rng, (steps, 1), bg.shared_ar, np.inf)
        factor *= np.exp(bg.shared_sd * z - 0.5 * bg.shared_sd**2)
    group_noise = np.ones((steps, n))
    if bg.group_sd > 0:
        groups = c[bg.group_by]
        z = _ar_series(rng, (steps, int(groups.max()) + 1), bg.shared_ar, np.inf)
        group_noise = np.exp(bg.group_sd * z[:, groups] - 0.5 * bg.group_sd**2)
        factor *= group_noise
    static = 1.0 + bg.offset * (2.0 * rng.random(n) - 1.0)
    if bg.slow_group > 1.0:
        if layout.n_hosts >= 2:
            hosts = rng.permutation(layout.n_hosts)[: max(1, round(bg.slow_share * layout.n_hosts))]
            slow = np.isin(c["host"], hosts)
        else:
            slow = np.zeros(n, bool)
            slow[rng.permutation(n)[: max(1, round(bg.slow_share * n))]] = True
        static = np.where(slow, static * bg.slow_group, static)
    factor *= static
    if bg.warmup:
        w = np.arange(bg.warmup)
        factor[: bg.warmup] *= (1.0 + (bg.warmup_factor - 1.0) * np.exp(-3.0 * w / bg.warmup))[:, None]
    if bg.eval_every:
        ev = np.arange(bg.eval_every - 1, steps, bg.eval_every)
        factor[ev] *= bg.eval_factor

    stall = np.zeros((steps, n))
    if bg.blip_rate > 0:
        hit = rng.random((steps, layout.n_hosts)) < bg.blip_rate
        size_ = rng.uniform(*bg.blip, (steps, layout.n_hosts)) * STEP_MS
        stall = np.where(hit, size_, 0.0)[:, c["host"]]
    spike = np.zeros((steps, n))
    if bg.spike_rate > 0:
        hit = rng.random((steps, n)) < bg.spike_rate
        spike = np.where(hit, rng.uniform(*bg.spike, (steps, n)) * STEP_MS, 0.0)
    gc = np.zeros((steps, n))
    if bg.gc_rate > 0:
        gc = np.where(
            rng.random((steps, n)) < bg.gc_rate, bg.gc * STEP_MS * rng.uniform(0.5, 1.5, (steps, n)), 0.0
        )
    ckpt = np.zeros(steps)
    if bg.ckpt_every:
        ckpt[np.arange(bg.ckpt_every, steps, bg.ckpt_every)] = bg.ckpt * STEP_MS
    present = (
        rng.random((steps, n)) >= bg.missing
        if bg.missing > 0 and path != "csv_time"
        else np.ones((steps, n), bool)
    )

    faults: list[SpaceFault] = []
    if faulty:
        two = rng.random() < 0.2
        count = n_faults if n_faults is not None else (2 if two else 1)
        settle = max(bg.warmup, 10) + int(50 * sample_every)
        used: set[int] = set()
        for _ in range(count):
            drawn = str(rng.choice(SHAPES, p=[0.35, 0.15, 0.15, 0.15, 0.2]))
            shape_ = shape or drawn
            for _try in range(20):
                who, ranks, group = _who(rng, layout)
                if not used & set(ranks):
                    break
            used |= set(ranks)
            room = steps - settle - 5
            shortest = int(max(8, 4 * sample_every, 24 if shape_ in ("sawtooth", "every_k") else 0))
            length = round(_loguniform(rng, shortest, max(shortest + 1, min(800, room))))
            length = min(length, room)
            first = steps - length if rng.random() < 0.2 else int(rng.integers(settle, steps - length + 1))
            m = _magnitude(rng, shape_, who)
            f, period = _fault_factor(rng, shape_, steps, first, length, m)
            active = np.flatnonzero(f > 1.0 + 1e-9)
            lo = int(active[0]) if len(active) else first
            if shape_ == "ramp":  # the label's onset: where the drift adds 5 %
                lo = int(np.flatnonzero(f >= 1.05 - 1e-12)[0]) if (f >= 1.05 - 1e-12).any() else lo
            hi = int(active[-1]) if len(active) else first + length - 1
            factor[:, list(ranks)] *= f[:, None]
            faults.append(SpaceFault(shape_, who, group, ranks, lo, hi, m, period, f))
    return SpaceJob(
        seed,
        layout,
        steps,
        bg,
        tuple(faults),
        path,
        sample_every,
        own,
        group_noise,
        factor,
        stall,
        spike,
        gc,
        ckpt,
        present,
    )
