"""Change points per rank: each rank against its own past and its peers, online.

A rank's *residual* in a step is the log-ratio of its own work (every own-work phase,
:data:`~detectors.cross_rank.OWN_WORK`) to a reference of its peers in that step, on two
series: its group's (the pp stage by default) and its data-parallel replica's, each the
group's fast side (25th percentile, the least of a small group), so that a shared per-step
factor (data-dependent steps, a slow replica's or stage's step) cancels and a slow minority
does not move the reference. The rank's *baseline* is what its residual usually is (a
static offset, a persistent speed group): learned over its first ``cp_learn`` samples and
then followed slowly while nothing is open. A one-sided CUSUM of the deviation from the
baseline, clipped on both sides (one spike adds at most the clip), opens a *change* when
the evidence it accumulated passes ``h``: a sustained shift is found even when no single
step stands out, with its onset (where the sum last left zero). A second CUSUM, of the
open change's half size minus the deviation, ends it (its end: where that sum last left
zero). Noise scales are per rank and series, from the residual's differences, and widened
by its autocorrelation (long-run sigma); the test runs on the deviation prewhitened by that
autocorrelation, so that a shock of autocorrelated noise is one clipped step and its decay
adds nothing, and a change still building whose level is dying away does not open. Where a
series has enough ranks to outvote a fault, the autocorrelation is the ranks' median, and
the job checks its ranks' models against each other (:func:`_calibrate`) and widens them
where they fall short (noise near a unit root or of several kinds).

:func:`rank_residuals` is stateless (one step's batch); :func:`track` folds one step's
residuals into a :class:`ChangeState` (plain arrays, vectorized over ranks) and says which
changes opened and closed. Grouping changes into common causes is
:mod:`detectors.common_cause`'s.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from argus.schemas import RankResiduals, StepBatch

from ._config import DiagnoserConfig
from ._robust import FEW, SPEED_GAP, GroupIndex
from .cross_rank import METRICS, OWN_WORK, rank_metrics

__all__ = [
    "SERIES",
    "ChangeState",
    "ChangeStep",
    "RankResiduals",
    "building",
    "rank_residuals",
    "residuals",
    "step_residuals",
    "stirring",
    "track",
]

SERIES: tuple[str, ...] = ("group", "replica")
"""The references a rank's residual is taken against: its group (pp stage), its dp replica."""
_OWN = np.array([METRICS.index(m) for m in OWN_WORK])
_REF_Q = 0.25
_SMALL_GROUP = 8
_SAMPLE = 256
_MIN_REPLICA = 4
"""A replica of fewer ranks is no reference (a log's ranks are one replica each)."""
_MAX_AC = 0.95
_YOUNG = 4
"""A rank's noise model is at least its series' typical rank's until it has seen this
many times ``cp_learn`` samples."""
_BLOCK = 16
"""Samples per block of the long-run variance's block means."""
_FADE_ALPHA = 0.5
"""Weight of the last deviation in its recent level (:func:`track`'s fading test)."""
_FADE = 0.75
"""A building change whose recent level fell under this share of its peak is fading."""
_FALLEN = 0.5
"""A building change whose last deviation fell under this share of its run's mean waits."""
_MIN_RUN = 3
"""Samples adding evidence a change opens from at the least: fewer are blips (transients)."""
_TESTING = 4
"""A change building whose opening sum is a ``1 / _TESTING`` share of its threshold or more
holds its rank's own noise model, as an open one does (:func:`track`; quiet AR(1) noise,
simulated with its true model, gets there in about one sample in a thousand)."""
_FADE_AC = 0.5
"""...where the rank's noise is this autocorrelated or more (a shock of it dies away)."""
_POOL = 32
"""Steps of memory of the job's check of its ranks' noise models (:func:`_calibrate`)."""
_RHO_MIN = 32
"""Ranks whose median autocorrelation is every rank's (:func:`_rho`; from 4 ranks, a
14-worker job's fault of 5 workers of its faster kind went unfound)."""
_POOL_MIN = 32
"""Ranks a series' check of the models needs (a small job's ranks are too few)."""


def _low_ref(v: np.ndarray, gi: GroupIndex) -> np.ndarray:
    """Per group, the fast side of ``v`` (n,): the value at ``_REF_Q`` of the group (the
    least of two or three; of a strided sample of about ``_SAMPLE`` ranks in a larger group).
    Returns (n_groups,)."""
    out = np.empty(gi.n_groups)
    xs = v[gi.order]
    if gi.n_groups and np.all(gi.sizes == gi.sizes[0]):
        size = int(gi.sizes[0])
        cube = xs.reshape(gi.n_groups, size)[:, :: max(1, size // _SAMPLE)]
        kth = int(_REF_Q * (cube.shape[1] - 1)) if size > 3 else 0
        out[:] = np.partition(cube, kth, axis=1)[:, kth]
        return out
    for j, (s, k) in enumerate(zip(gi.starts.tolist(), gi.sizes.tolist(), strict=True)):
        block = xs[s : s + k : max(1, k // _SAMPLE)]
        kth = int(_REF_Q * (len(block) - 1)) if k > 3 else 0
        out[j] = np.partition(block, kth)[kth]
    return out


def _peer_ref(v: np.ndarray, gi: GroupIndex) -> np.ndarray:
    """Each rank's reference in ``v`` (n,): its group's fast side (:func:`_low_ref`), but
    in a group of at most ``_SMALL_GROUP`` ranks, where the fast side is the same one or two
    ranks every step (whose residual would be nothing whatever their noise), the group's
    median, of two or three the mean of its peers (NaN alone). In a group of up to
    ``FEW`` ranks in two kinds (:func:`_two_kinds`), the faster kind is the group: the
    slower kind's ranks are referred to the faster kind's, which a job-wide slow stretch
    moves with them (a median between two kinds of six jumped from one to the other)."""
    ref = _small_ref(v, gi)
    xs = v[gi.order]
    for s, k in zip(gi.starts.tolist(), gi.sizes.tolist(), strict=True):
        if k > FEW:
            continue
        rows = gi.order[s : s + k]
        fast = _two_kinds(xs[s : s + k])
        if fast is None:
            continue
        kind = rows[fast]
        sub = _small_ref(v[kind], GroupIndex.of(np.zeros(len(kind), np.int64)))
        ref[rows] = float(np.median(v[kind]))
        ref[kind] = sub
    return ref


def _two_kinds(x: np.ndarray) -> np.ndarray | None:
    """Indexes of the faster kind of ``x`` (logs of a group's work) where it falls in two
    kinds ``SPEED_GAP`` apart, at least two ranks fast (else None)."""
    order = np.argsort(x)
    gaps = np.diff(x[order])
    if not len(gaps) or not np.isfinite(gaps).all():
        return None
    cut = int(np.argmax(gaps)) + 1
    if gaps[cut - 1] < np.log(SPEED_GAP) or cut < 2:
        return None
    return order[:cut]


def _small_ref(v: np.ndarray, gi: GroupIndex) -> np.ndarray:
    """:func:`_peer_ref` of groups of one kind."""
    size = gi.sizes[gi.inverse]
    ref: np.ndarray = _low_ref(v, gi)[gi.inverse]
    if int(size.min(initial=0)) > _SMALL_GROUP:
        return ref
    total = np.bincount(gi.inverse, weights=v)[gi.inverse]
    with np.errstate(invalid="ignore", divide="ignore"):
        peers = np.where(size > 1, (total - v) / (size - 1), np.nan)
    med = np.empty(gi.n_groups)
    xs = v[gi.order]
    for j, (s, k) in enumerate(zip(gi.starts.tolist(), gi.sizes.tolist(), strict=True)):
        med[j] = np.median(xs[s : s + k]) if k <= _SMALL_GROUP else 0.0
    return np.where(size <= 3, peers, np.where(size <= _SMALL_GROUP, med[gi.inverse], ref))


def residuals(
    res: RankResiduals, off: np.ndarray | None = None, whole: int = 0, levels: np.ndarray | None = None
) -> np.ndarray:
    """Each rank's residual (len(SERIES), n): the log of its own work over its peers' on
    each series (NaN where there is none). With ``off`` (len(SERIES), n), the ranks' known
    levels against their peers (their baselines), the reference of a group of four to
    ``FEW`` ranks is taken from their work less those levels: a step's reference then does
    not depend on which ranks reported in it nor on which of two speed groups its median
    fell in (a log sampled at random times: a rank's residual jumped by the groups' gap from
    step to step). The levels' own fast side is added back: the baselines follow the
    residuals, and a reference on the fast side of the peers would otherwise lift them all
    a little every step, and a rank whose change is open (its baseline held) would drift
    from its peers. ``whole``: the ranks of the job where the step holds one group: a step
    that holds two or three of a log's four or more ranks (staggered samples) takes its
    reference less their levels too (of raw peers, a rank's residual jumped by their
    offsets, 10 %, in one sample of eight, and its noise model widened fourfold).
    ``levels``: the known levels of every rank of such a job (on the first series), whose
    fast side is the one added back, not that of the ranks that reported in the step: with
    offsets of 10 %, the second-fastest level of the step's six ranks of eight is another
    rank's than of all eight, and every rank's residual moved with it, 1-3 % from sample
    to sample (five times its own noise: a worker's 9 % sawtooth went unfound)."""
    r = np.full((len(SERIES), len(res.lw)), np.nan)
    if len(res.lw) < 2:
        return r
    for i, (on, keys) in enumerate(((True, res.group), (res.replicas, res.dp))):
        if on:
            gi = GroupIndex.of(keys)
            # (not in a group of two or three: the peers' mean is each rank's reference, and
            # the levels' first swings, learned from a warm-up step, would feed back into it;
            # nor in one of more than FEW: a host slow since the start, a quarter of its
            # replica, back to its peers' pace dragged the replica's fast side down with it)
            fits = (gi.sizes > 3) & (gi.sizes <= FEW)
            if i == 0 and gi.n_groups == 1 and 3 < whole <= FEW:
                fits[:] = True  # (a group of the job's four or more, whose levels are known)
            if off is None or not fits.any():  # (a large job's groups: nothing to correct)
                r[i] = res.lw - _peer_ref(res.lw, gi)
                continue
            o = np.where(fits[gi.inverse], off[i], 0.0)
            if i == 0 and levels is not None and len(levels) > 3 and gi.n_groups == 1 and fits.all():
                low = _low_ref(levels, GroupIndex.of(np.zeros(len(levels), np.int64)))
            else:
                low = _low_ref(o, gi)
            r[i] = res.lw - _peer_ref(res.lw - o, gi) - low[gi.inverse]
    return r


def step_residuals(batch: StepBatch, config: DiagnoserConfig | None = None) -> RankResiduals:
    """The ranks of one step's batch for the change points (stateless, like :func:`cross_rank`)."""
    cfg = config or DiagnoserConfig()
    return rank_residuals(batch, rank_metrics(batch)[0], cfg.group_column)


def rank_residuals(batch: StepBatch, x: np.ndarray, group_column: str = "pp") -> RankResiduals:
    """The ranks of one step from its metric matrix ``x`` (:func:`rank_metrics`)."""
    own = x[_OWN]
    work = np.maximum(own.sum(axis=0), 1e-6)
    n = len(work)
    gi = GroupIndex.of(batch[group_column])
    typical = np.median(own[:, :: max(1, n // 4096)], axis=1) if n else np.zeros(len(_OWN))
    untimed = not bool(np.any(own[:-1] > 0))  # a log of step times: all of it unaccounted
    phase = np.argmax(own - typical[:, None], axis=0).astype(np.int8)
    if untimed:  # (a fast worker's is below the typical one: argmax named compute)
        phase[:] = len(_OWN) - 1
    dp = np.asarray(batch["dp"])
    gd = GroupIndex.of(dp)
    return RankResiduals(
        np.asarray(batch["rank"], np.int64),
        RankResiduals.quantized(np.log(work)),
        phase,
        float(np.median(_low_ref(work, gi))) if n else 0.0,
        np.asarray(batch["host"]),
        dp,
        np.asarray(batch[group_column]),
        replicas=bool(gd.n_groups and int(gd.sizes.min()) >= _MIN_REPLICA),
        untimed=untimed,
    )


_FIELDS = (
    "n", "base", "v1", "v2", "prev", "prev2", "bsum", "bprev", "bdirty", "vb", "s2", "s2_from", "s", "s_from", "s_sum", "s_cnt", "c_sum", "onset", "size", "csize", "t",
    "t_from", "seen", "zsum", "zcnt", "zdirty", "ew", "peak", "lxy", "lxx", "hush", "s_up", "lag", "spread",
)  # fmt: skip
_SPIKES = 6
"""Spikes whose regular gaps make a rank slow every k-th step."""
_SPIKE = 4.0
"""A spike: a deviation of this many of the rank's own (marginal) sigmas or more, at least
``cp_spike``."""
_BEATS = 2
"""Gaps of a rank's last spikes at a period that make it beat with it (:func:`shared_rhythm`)."""
_INT_FIELDS = frozenset(
    {"n", "s_from", "s2_from", "onset", "t_from", "seen", "zdirty", "hush", "s_up", "lag"}
)
_BYTE_FIELDS = frozenset({"hush", "s_up", "lag", "bdirty"})
"""Fields that hold small counts: a byte each in the state's document."""


def _rows() -> np.ndarray:
    return np.zeros((len(SERIES), 0))


def _dtype(name: str) -> type[np.generic]:
    """The dtype a state field is written with."""
    if name == "phase" or name in _BYTE_FIELDS:
        return np.int8
    return np.int32 if name in _INT_FIELDS else np.float32


def _int_rows() -> np.ndarray:
    return np.zeros((len(SERIES), 0), np.int64)


@dataclass
class ChangeState:
    """Per rank (row = rank id) and series: samples seen ``n``, ``base`` the residual's
    level; its noise model: ``v1`` and ``v2`` (EW means of its squared differences one and
    two samples apart: :attr:`sig` and :attr:`ac`) and the last two residuals ``prev``,
    ``prev2``; ``vb`` the EW mean square of the
    differences of consecutive means of ``_BLOCK`` samples (``bsum``: the open block's sum,
    ``bprev``: the last block's mean; ``bdirty``: whether evidence built in the open block
    (1) and in the last one (2): a difference of their means is no noise);
    the opening CUSUM ``s`` since ``s_from`` (and the sum and count of the deviations
    since, as they are and clipped), an open change's ``onset`` (-1: none), ``size`` (its
    mean deviation) and ``csize`` (of the deviations clipped as the test clips them: a
    slowdown of every k-th step is a small clipped shift), the closing CUSUM ``t``
    since ``t_from``; ``seen`` the last step the rank reported; ``ew`` and ``peak``: a
    building change's recent level and its highest (a shock dying away is no change);
    ``lxy``, ``lxx``: the regression of the deviation on the last one (the pooled
    autocorrelation); ``zsum``, ``zcnt``, ``zdirty``: the job's check of the noise models
    (a rank's summed deviations, their count, the step until which it is left out), and
    per series its result ``scale`` after ``checks`` steps; ``hush``: whether the last
    sample (bit 0) and the one before (bit 1) were a spike of a rhythm, left out of the
    noise model (:func:`_spikes`); ``lag``: the steps from an open change's onset to the
    step it opened in, ``spread``: the steps within which its onset is known, as it opened
    (:func:`track`; both at most 127: :meth:`began`). ``phase``: per rank, the
    own-work phase that rose when its change opened. ``beats``: the first steps of the job's
    last ``_SPIKES`` global runs (every rank far slower: :func:`job_beat`)."""

    n: np.ndarray = field(default_factory=_int_rows)
    base: np.ndarray = field(default_factory=_rows)
    v1: np.ndarray = field(default_factory=_rows)
    v2: np.ndarray = field(default_factory=_rows)
    prev: np.ndarray = field(default_factory=_rows)
    prev2: np.ndarray = field(default_factory=_rows)
    bsum: np.ndarray = field(default_factory=_rows)
    bprev: np.ndarray = field(default_factory=_rows)
    bdirty: np.ndarray = field(default_factory=_rows)
    vb: np.ndarray = field(default_factory=_rows)
    s2: np.ndarray = field(default_factory=_rows)
    s2_from: np.ndarray = field(default_factory=_int_rows)
    s: np.ndarray = field(default_factory=_rows)
    s_from: np.ndarray = field(default_factory=_int_rows)
    s_sum: np.ndarray = field(default_factory=_rows)
    s_cnt: np.ndarray = field(default_factory=_rows)
    c_sum: np.ndarray = field(default_factory=_rows)
    onset: np.ndarray = field(default_factory=_int_rows)
    size: np.ndarray = field(default_factory=_rows)
    csize: np.ndarray = field(default_factory=_rows)
    t: np.ndarray = field(default_factory=_rows)
    t_from: np.ndarray = field(default_factory=_int_rows)
    seen: np.ndarray = field(default_factory=_int_rows)
    ew: np.ndarray = field(default_factory=_rows)
    lxy: np.ndarray = field(default_factory=_rows)
    lxx: np.ndarray = field(default_factory=_rows)
    hush: np.ndarray = field(default_factory=_int_rows)
    s_up: np.ndarray = field(default_factory=_int_rows)
    lag: np.ndarray = field(default_factory=_int_rows)
    spread: np.ndarray = field(default_factory=_int_rows)
    peak: np.ndarray = field(default_factory=_rows)
    zsum: np.ndarray = field(default_factory=_rows)
    zcnt: np.ndarray = field(default_factory=_rows)
    zdirty: np.ndarray = field(default_factory=_int_rows)
    scale: np.ndarray = field(default_factory=lambda: np.ones(len(SERIES)))
    checks: np.ndarray = field(default_factory=lambda: np.zeros(len(SERIES)))
    phase: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    spikes: np.ndarray = field(default_factory=lambda: np.zeros((0, _SPIKES), np.int64))
    period: np.ndarray = field(default_factory=lambda: np.zeros((3, 0), np.int64))
    spike_size: np.ndarray = field(default_factory=lambda: np.zeros(0))
    beats: np.ndarray = field(default_factory=lambda: np.full(_SPIKES, -1, np.int64))

    @property
    def ac(self) -> np.ndarray:
        """Each rank's lag-1 autocorrelation, an AR(1)'s from ``v1 = 2 sig^2 (1 - ac)`` and
        ``v2 = 2 sig^2 (1 - ac^2)`` (0 to ``_MAX_AC``)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.v1 > 0, np.clip(self.v2 / self.v1 - 1.0, 0.0, _MAX_AC), 0.0)

    @property
    def sig(self) -> np.ndarray:
        """Each rank's noise scale (the AR(1)'s marginal sigma)."""
        return np.sqrt(self.v1 / (2.0 * (1.0 - self.ac)))

    @property
    def n_ranks(self) -> int:
        """Rows held (the highest rank seen + 1)."""
        return int(self.n.shape[1])

    def grow(self, n: int) -> None:
        """Make room for ranks up to ``n - 1`` (new rows: nothing learned, nothing open)."""
        old = self.n_ranks
        if n <= old:
            return
        for name in _FIELDS:
            a = getattr(self, name)
            fill = -1 if name in ("onset", "seen") else 0
            pad = np.full((len(SERIES), n - old), fill, a.dtype)
            setattr(self, name, np.concatenate((a, pad), axis=1))
        self.phase = np.concatenate((self.phase, np.zeros(n - old, np.int8)))
        self.spikes = np.concatenate((self.spikes, np.full((n - old, _SPIKES), -1, np.int64)))
        self.period = np.concatenate((self.period, np.full((3, n - old), -1, np.int64)), axis=1)
        self.spike_size = np.concatenate((self.spike_size, np.zeros(n - old)))

    def silent(self, rank: int, learn: int) -> bool:
        """Whether ``rank``'s own past shows no change: it is tracked, has seen ``learn``
        samples, and nothing is open on it (a change, a rhythm)."""
        if not 0 <= rank < self.n_ranks or self.n[0, rank] < learn:
            return False
        return not self.changed(rank) and self.period[0, rank] < 0

    def changed(self, rank: int) -> bool:
        """Whether a change is open on ``rank`` (on any series)."""
        return 0 <= rank < self.n_ranks and bool((self.onset[:, rank] >= 0).any())

    def learning(self, rank: int, learn: int) -> bool:
        """Whether ``rank``'s own baseline is not learned yet (fewer than ``learn`` samples)."""
        return not 0 <= rank < self.n_ranks or bool(self.n[0, rank] < learn)

    def began(self, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per rank of ``cols``, of its open change (on its series of the earliest onset):
        the steps within which its onset is known and the step it opened in (0 and -1
        where none is open)."""
        none = np.iinfo(np.int64).max
        on = np.where(self.onset[:, cols] >= 0, self.onset[:, cols], none)
        first = np.argmin(on, axis=0)[None, :]
        at = np.take_along_axis(on, first, axis=0)[0]
        lag = np.take_along_axis(self.lag[:, cols], first, axis=0)[0]
        spread = np.take_along_axis(self.spread[:, cols], first, axis=0)[0]
        is_open = at < none
        return np.where(is_open, spread, 0), np.where(is_open, at + lag, -1)

    def open_ranks(self) -> np.ndarray:
        """Ranks with a change open on any series, or slow every k-th step."""
        return np.flatnonzero((self.onset >= 0).any(axis=0) | (self.period[0] >= 0))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (arrays as base64 of their bytes: ~100 bytes per rank)."""
        out: dict[str, Any] = {
            "ranks": self.n_ranks,
            "spikes": base64.b64encode(self.spikes.astype(np.int32).tobytes()).decode(),
            "period": base64.b64encode(self.period.astype(np.int32).tobytes()).decode(),
            "spike_size": base64.b64encode(self.spike_size.astype(np.float32).tobytes()).decode(),
            "scale": [float(x) for x in self.scale],
            "checks": [float(x) for x in self.checks],
            "beats": [int(x) for x in self.beats],
        }
        for name in (*_FIELDS, "phase"):
            a = getattr(self, name)
            a = a.astype(_dtype(name))
            out[name] = base64.b64encode(a.tobytes()).decode()
        return out

    @classmethod
    def from_dict(cls, data: Any) -> ChangeState:
        """Inverse of :meth:`to_dict`."""
        st = cls()
        if data and "beats" in data:
            st.beats = np.asarray(data["beats"], np.int64)[-_SPIKES:]
        n = int(data.get("ranks", 0)) if data else 0
        if not n:
            return st
        st.spikes = (
            np.frombuffer(base64.b64decode(data["spikes"]), np.int32).reshape(n, _SPIKES).astype(np.int64)
        )
        st.period = np.frombuffer(base64.b64decode(data["period"]), np.int32).reshape(3, n).astype(np.int64)
        st.spike_size = np.frombuffer(base64.b64decode(data["spike_size"]), np.float32).astype(float)
        st.scale = np.asarray(data.get("scale", [1.0] * len(SERIES)), float)
        st.checks = np.asarray(data.get("checks", [0.0] * len(SERIES)), float)
        for name in (*_FIELDS, "phase"):
            dt = _dtype(name)
            if name not in data:  # a state from before the field: nothing learned of it yet
                setattr(st, name, np.zeros((len(SERIES), n), np.int64 if name in _INT_FIELDS else float))
                continue
            raw = base64.b64decode(data[name])
            if name != "phase" and len(raw) != len(SERIES) * n * np.dtype(dt).itemsize:
                dt = np.int32 if name in _INT_FIELDS else np.float32  # an older build's width
            a = np.frombuffer(raw, dt)
            if name == "phase":
                st.phase = a.astype(np.int8)
            else:
                setattr(
                    st, name, a.reshape(len(SERIES), n).astype(np.int64 if name in _INT_FIELDS else float)
                )
        return st


@dataclass(frozen=True)
class ChangeStep:
    """What one step did to the changes: those that ``opened`` (rank, series) and those that
    ``closed`` (rank, series, their end step)."""

    opened: tuple[tuple[int, int], ...] = ()
    closed: tuple[tuple[int, int, int], ...] = ()


def _rho(st: ChangeState, cfg: DiagnoserConfig, ac: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per series and rank, the autocorrelation the test uses, and per series the typical
    rank's ((len(SERIES), 1)). Where a series has ``_RHO_MIN`` ranks that learned theirs,
    every rank's is the median of the ranks' regressions of the deviation on the last one
    (``lxy / lxx``): heavy-tailed noise is shocks that die away as the noise does, which
    such a regression follows, and a minority of faulty ranks does not move a median; the
    differences' ratio gave 0.3 for noise of 0.86 there, and a shock took one rank's own from
    0.9 to 0.4 in five steps as it built evidence. Elsewhere (too few ranks to outvote a
    fault) each rank's own from its differences (``ac``: :attr:`ChangeState.ac`), a young rank's at
    most the typical one."""
    learned = st.n >= cfg.cp_learn
    pooled = learned.sum(axis=1) >= _RHO_MIN
    typ = np.zeros((len(SERIES), 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        reg = np.clip(st.lxy / st.lxx, 0.0, _MAX_AC)
    for i in range(len(SERIES)):
        if pooled[i]:
            typ[i] = float(np.median(reg[i, learned[i] & (st.lxx[i] > 0)]))
        elif learned[i].any():
            typ[i] = float(np.median(ac[i, learned[i]]))
    young = st.n < _YOUNG * cfg.cp_learn
    return np.where(pooled[:, None], typ, np.where(young, np.minimum(ac, typ), ac)), typ


def _long_run(st: ChangeState, rho: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per series and rank: sigma of an AR(1) of autocorrelation ``rho`` from the lag-1
    mean square, and the long-run sigma (the spread of a sum's steps: widened by the
    autocorrelation, at least the block means' one)."""
    sig = np.sqrt(st.v1 / (2.0 * (1.0 - rho)))
    return sig, np.maximum(sig * np.sqrt((1 + rho) / (1 - rho)), np.sqrt(st.vb * _BLOCK / 2))


def _scales(
    st: ChangeState, cols: np.ndarray | slice, cfg: DiagnoserConfig, rho: np.ndarray
) -> tuple[np.ndarray, ...]:
    """Per series and rank of ``cols``: the sigma, and the reference ``k``, clip ``c`` and
    threshold ``h`` of the CUSUM from the long-run sigma. A rank's is at least half the
    typical rank's of its series (a rank that was the fastest of two all along learned a
    spread of nothing); until it has seen ``_YOUNG * cp_learn`` samples, at least the
    typical rank's (a score of samples of autocorrelated noise look calmer than it is: one
    job's ranks learned a third of their long-run sigma and opened over a hundred changes)."""
    s_all, lr_all = _long_run(st, rho)
    sig, lr = s_all[:, cols], lr_all[:, cols]
    learned = st.n >= cfg.cp_learn // 2
    typ = np.zeros((2, len(SERIES)))
    for i in range(len(SERIES)):
        if learned[i].any():
            typ[:, i] = np.median(s_all[i, learned[i]]), np.median(lr_all[i, learned[i]])
    young = st.n[:, cols] < _YOUNG * cfg.cp_learn
    sig = np.maximum(sig, np.where(young, 1.0, 0.5) * typ[0][:, None])
    lr = np.maximum(lr, np.where(young, 1.0, 0.5) * typ[1][:, None]) * st.scale[:, None]
    k = np.maximum(cfg.cp_k * lr, cfg.cp_min_shift / 2)
    c = np.maximum(np.maximum(cfg.cp_clip * lr, cfg.cp_fast_shift), 2 * k)
    h = np.maximum(cfg.cp_h * lr, cfg.cp_min_evidence)
    return sig, k, c, h, lr


def _spikes(
    st: ChangeState,
    cols: np.ndarray,
    d: np.ndarray,
    ready: np.ndarray,
    c: np.ndarray,
    sig: np.ndarray,
    step: int,
    cfg: DiagnoserConfig,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank of ``cols`` (``d``: its group series' deviation): whether it spikes, whether
    that spike keeps a rhythm, and whether its open rhythm is due.

    A spike is over ``_SPIKE`` of the rank's own sigma (at most the clip), and at least
    ``cp_spike``: one slow step is a shock on one step, which the marginal sigma weighs (the
    clip, of the long-run sigma that the autocorrelation widens, kept a rank 1.6x on every
    sixth step among AR(0.9) noise under it). Where its rhythm is open and the step is due
    (within one of a multiple of its gap after its last spike: a step the log lacks skips a
    beat), a spike is over half the rhythm's spikes' size: its beat is its size (the
    noise's spikes of a third of it held one 14 steps past its end). A spike keeps a rhythm
    when due, or when its gap from the last spike is within one of the gap before: such a
    spike is left out of the noise model, whose sigma the spikes' differences widened
    until they no longer cleared it."""
    per = st.period[:, cols]
    # (a beat or two after its last spike: a step the log lacks, an evaluation, skips one)
    since, k = step - per[2], np.maximum(per[1], 1)
    due = (per[0] >= 0) & (np.abs(since - k * np.maximum(np.round(since / k), 1)) <= 1)
    clip = np.minimum(c, _SPIKE * sig)
    floor = np.maximum(np.where(due, st.spike_size[cols] / 2, clip), cfg.cp_spike)
    spike = ready & (d > floor)
    last, before = st.spikes[cols, -1], st.spikes[cols, -2]
    prior = last - before
    kept = (before >= 0) & (prior >= 2) & (prior <= cfg.cp_max_period) & (np.abs(step - last - prior) <= 1)
    return spike, spike & (due | kept), due


def _periodic(
    st: ChangeState,
    cols: np.ndarray,
    spike: np.ndarray,
    due: np.ndarray,
    d: np.ndarray,
    step: int,
    cfg: DiagnoserConfig,
) -> None:
    """Slow every k-th step: a rank's last ``_SPIKES`` spikes (``spike``: :func:`_spikes`),
    at regular gaps (within a step of each other, 2 to ``cp_max_period``; one of them may
    be twice that: a rank 1.5x on every fifth step whose third slow step was the job's
    evaluation, left out, was found from its fourth)
    open a periodic change at the first of them; it ends ``2k`` steps after its last spike
    (``period``: onset, gap, last spike per rank; ``spike_size``: the spikes' mean
    deviation, EW); an open rhythm is held and sized by its spikes that were ``due`` only
    (two spikes of the noise off its beat held one 14 steps past its end). One spike adds
    at most the clip to the
    CUSUM, so a slowdown of every fifth step or rarer is found here, not there."""
    rows = cols[spike]
    per = st.period
    if len(rows):
        st.spikes[rows] = np.concatenate((st.spikes[rows, 1:], np.full((len(rows), 1), step)), axis=1)
        beat = (per[0, rows] < 0) | due[spike]
        st.spike_size[rows] += np.where(beat, 0.25 * (d[spike] - st.spike_size[rows]), 0.0)
        sp = st.spikes[rows]
        gaps = np.diff(sp, axis=1)
        # (a beat may be missed: a step the log lacks, an evaluation's, skips one)
        g = gaps.min(axis=1, keepdims=True)
        beat_gap = np.abs(gaps - g) <= 1
        regular = (
            (sp[:, 0] >= 0) & (g[:, 0] >= 2) & (beat_gap | (np.abs(gaps - 2 * g) <= 2)).all(axis=1)
            & (beat_gap.sum(axis=1) >= gaps.shape[1] - 1) & (gaps.max(axis=1) <= cfg.cp_max_period)
        )  # fmt: skip
        new = rows[regular & (per[0, rows] < 0)]
        gap = np.array(
            [np.median(x[np.abs(x - x.min()) <= 1]) for x in np.diff(st.spikes[new], axis=1)], np.int64
        ).reshape(-1)
        mine = np.array(
            [not shared_rhythm(st, int(k), int(r)) for r, k in zip(new.tolist(), gap.tolist(), strict=True)],
            bool,
        )
        new, gap = new[mine], gap[mine]
        per[0, new] = st.spikes[new, 0]
        per[1, new] = gap
        per[2, rows] = np.where((per[0, rows] >= 0) & beat, step, per[2, rows])
    live = cols[per[0, cols] >= 0]
    over = live[step - per[2, live] > 2 * per[1, live] + 1]
    per[0, over] = -1
    st.spikes[over] = -1


def job_beat(st: ChangeState, step: int) -> None:
    """The job began a global run at ``step`` (every rank far slower: an evaluation)."""
    st.beats = np.append(st.beats[1:], step)


def _beating(spikes: np.ndarray, period: float | np.ndarray) -> np.ndarray:
    """Per row of spike steps, whether ``_BEATS`` of their gaps are ``period`` (or twice
    it: a beat missed) within a tenth (``period``: one, or a column of one per row)."""
    gaps = np.diff(spikes, axis=-1)
    tol = np.maximum(1.0, np.asarray(period) / 10)
    near = (spikes[..., :-1] >= 0) & ((np.abs(gaps - period) <= tol) | (np.abs(gaps - 2 * period) <= 2 * tol))
    return np.asarray(near.sum(axis=-1) >= _BEATS)


def shared_rhythm(st: ChangeState, period: int, rank: int = -1) -> bool:
    """Whether slow every ``period`` steps is the job's schedule (an evaluation every so
    many steps), not a fault: the whole job was (its global runs), or half its ranks or
    more are, each at its own phase. In a log whose workers' clocks drift apart, each
    rank's evaluation falls in other windows than its peers' and stands out of them: the
    job's first few, still together, and later every rank's own; one rank's or a few's
    rhythm is a fault. A log sampled by time counts windows, not steps: with ``rank``
    (whose rhythm it is), a rank ``x`` times slower beats the same schedule every ``x``
    times the windows (a worker 10 % faster than its peers beat the evaluations every 34
    windows, they every 38 to 39, and it paged "slow every 34 steps")."""
    seen = np.flatnonzero(st.n[0] > 0)
    if not len(seen) or period < 3:
        return False
    if _beating(st.beats, period):
        return True
    beating = _beating(st.spikes[seen], period)
    if 0 <= rank < st.n_ranks:
        ratio = np.exp(st.base[0, seen] - st.base[0, rank])
        beating |= _beating(st.spikes[seen], (period * ratio)[:, None])
    return 2 * int(beating.sum()) >= len(seen)


def _noise(
    st: ChangeState,
    idx: np.ndarray | slice,
    r: np.ndarray,
    ok: np.ndarray,
    n: np.ndarray,
    cfg: DiagnoserConfig,
    evidence: np.ndarray,
    ac: np.ndarray,
    hushed: np.ndarray,
    testing: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """The noise model of each rank's residual from its differences: ``v1`` and ``v2``, the
    EW mean squares of ``r`` minus the residual one and two samples before (both Winsorized
    at 4 of the lag-1 RMS), give an AR(1)'s scale and autocorrelation (``v1 = 2 sig^2 (1 -
    ac)``, ``v2 = 2 sig^2 (1 - ac^2)``). A level shift (a fault) is one large difference, so
    the model holds through a fault. From the residual's deviations it took in every fault
    that had not opened yet, and from the samples near the baseline only it shrank (a
    rank's sigma settled at 0.8 of its noise's, an autocorrelation of 0.6 at 0.3); a level
    gate shrank it on skewed noise (the log of a gamma-distributed wait), and leaving out
    large differences shrank it on heavy-tailed noise (the CUSUM then paged on its tails:
    192 times on one quiet job). The long-run variance of noise of
    several kinds (a rank's own, its replica's wander: no AR(1)) is the block means': ``vb``
    from the differences of consecutive blocks' means, but not across a block in which
    ``evidence`` built (a change open or building: a fault's onset in a difference of block
    means is no noise); ``ac``: each rank's autocorrelation (:attr:`ChangeState.ac`) as the
    step began; ``hushed``: per rank, a spike of a rhythm, which no difference takes in
    (nor the next two: ``hush``) and its block sums as its baseline; ``testing``: a change
    under test or open, whose differences are left out but for a jump (:func:`track`). Returns the new ``v1``,
    ``v2``."""
    v1, v2 = st.v1[:, idx], st.v2[:, idx]
    prev, prev2 = st.prev[:, idx], st.prev2[:, idx]
    was = st.hush[:, idx]
    # both Winsorized at 4 of the lag-1 RMS (a shift's difference, at each one's own RMS,
    # weighed 1.6 times more in the lag-2 mean square, twice: a fault's onset raised the
    # autocorrelation they give from 0.6 to 0.85 before its change opened)
    cap = np.where(n >= 5, 4 * np.sqrt(v1), np.inf)
    # a jump (a level shift: a flapping fault's every edge) is one capped lag-1 difference
    # but two capped lag-2 ones, and took the autocorrelation to its bound (0.8 to 0.95 on
    # one rank's first edges, its sigma 2.5 times, and the fault's later stretches went
    # unfound): in the two lag-2 differences across it the jump weighs (1 + ac) / 2 each
    first = ok & (n >= 1) & ~hushed & (was & 1 == 0)  # a lag-1 difference to take in
    jump = (first & (np.abs(r - prev) > cap)) | ((n >= 3) & (was == 0) & (np.abs(prev - prev2) > cap))
    # (a change under test still takes in the differences at and across a jump: a flapping
    # rank's edges widen its model, which holds its change open through the stretches off)
    held = testing & ~jump
    d1 = np.where(first & ~held, r - prev, np.nan)
    d2 = np.where(ok & (n >= 2) & ~hushed & ~held & (was & 2 == 0), r - prev2, np.nan)
    st.hush[:, idx] = np.where(ok, ((was & 1) << 1) | hushed, was)
    cap2 = np.where(jump, np.sqrt((1.0 + ac) / 2.0), 1.0) * cap
    out = []
    for v, dd, need, cp in ((v1, d1, 1, cap), (v2, d2, 2, cap2)):
        seen = np.maximum(n - need, 0)  # differences seen before this one
        w = np.minimum(np.abs(np.where(np.isfinite(dd), dd, 0.0)), cp)
        a = np.where(np.isfinite(dd), np.where(seen < cfg.cp_learn, 1.0 / (seen + 1.0), cfg.cp_alpha), 0.0)
        out.append(v + a * (w * w - v))
    v1, v2 = out
    # block means: noise of several kinds (a rank's own, its replica's wander) is no AR(1),
    # and one fitted from lags 1 and 2 misses most of the slow kind's long-run variance
    # each sample Winsorized as the differences are (about its baseline): one spike in a
    # block of 16 moved its mean by a twentieth and the long-run sigma with it for a hundred
    base = st.base[:, idx]
    bsum = st.bsum[:, idx] + np.where(ok, base + np.where(hushed, 0.0, np.clip(r - base, -cap, cap)), 0.0)
    closes = ok & ((n + 1) % _BLOCK == 0)
    mean = bsum / _BLOCK
    blocks = (n + 1) // _BLOCK  # blocks closed with this one
    vb = st.vb[:, idx]
    dirty = st.bdirty[:, idx] + np.where(evidence, 1.0 - st.bdirty[:, idx] % 2, 0.0)  # bit 0: this block
    clean = dirty == 0
    first = vb == 0  # the first difference of block means taken in
    young = blocks - 2 < _YOUNG
    a = np.where(
        closes & (blocks >= 2) & clean,
        np.where(first, 1.0, np.where(young, 1.0 / np.maximum(blocks - 1.0, 1.0), 0.1)),
        0.0,
    )
    lim = np.where(blocks >= 4, 4 * np.sqrt(vb), np.inf)
    w = np.minimum(np.abs(mean - st.bprev[:, idx]), lim)
    vb = vb + a * (w * w - vb)
    st.bprev[:, idx] = np.where(closes, mean, st.bprev[:, idx])
    st.bsum[:, idx] = np.where(closes, 0.0, bsum)
    st.bdirty[:, idx] = np.where(closes, 2.0 * (dirty % 2), dirty)  # this block's bit becomes the last's
    st.vb[:, idx] = vb
    return v1, v2


def _regress(
    st: ChangeState,
    idx: np.ndarray | slice,
    d: np.ndarray,
    d_prev: np.ndarray,
    use: np.ndarray,
    sig: np.ndarray,
    n: np.ndarray,
    cfg: DiagnoserConfig,
) -> None:
    """Each rank's regression of its deviation on the last one (EW means ``lxy``, ``lxx``;
    :func:`_rho` pools them), from consecutive samples with nothing open, but not the step
    after a one-step spike (a large deviation gone at once: a shock of the noise itself
    dies away as the noise does)."""
    spike_gone = (np.abs(d_prev) > 4 * sig) & (np.abs(d) < 0.25 * np.abs(d_prev))
    take = use & ~spike_gone
    a = np.where(take, np.where(n < cfg.cp_learn, 1.0 / (n + 1.0), cfg.cp_alpha), 0.0)
    st.lxy[:, idx] += a * (d * d_prev - st.lxy[:, idx])
    st.lxx[:, idx] += a * (d_prev * d_prev - st.lxx[:, idx])


def _calibrate(
    st: ChangeState,
    idx: np.ndarray | slice,
    dc: np.ndarray,
    ready: np.ndarray,
    is_open: np.ndarray,
    lr: np.ndarray,
    step: int,
) -> None:
    """The job's own check of its ranks' noise models, per series: each rank's clipped
    deviations over its long-run sigma, summed with a memory of ``_POOL`` steps
    (``zsum``, over the spread such a sum of independent unit steps has after ``zcnt``
    of them), are about standard normal across the ranks when the models hold. Their
    robust spread (an IQR: a minority of faulty ranks does not move it; ranks with a
    change open in the last ``_POOL`` steps left out), followed over the steps and at
    least 1, widens every rank's long-run sigma (``scale``): noise near a unit root or of
    several kinds, whose long-run variance a few hundred samples of one rank do not give
    (one quiet job's ranks saw 0.6 of theirs and opened 190 changes)."""
    lam = 1.0 - 1.0 / _POOL
    raw = np.maximum(lr / st.scale[:, None], 1e-12)
    st.zsum[:, idx] = np.where(ready, lam * st.zsum[:, idx] + dc / raw, st.zsum[:, idx])
    st.zcnt[:, idx] += ready
    st.zdirty[:, idx] = np.where(is_open, step + _POOL, st.zdirty[:, idx])
    for i in range(len(SERIES)):
        use = (st.zcnt[i] >= 4) & (st.zdirty[i] < step)
        if int(use.sum()) < _POOL_MIN:
            continue
        m = st.zcnt[i, use]
        z = st.zsum[i, use] * np.sqrt((1.0 - lam * lam) / (1.0 - lam ** (2.0 * m)))
        q1, q3 = np.percentile(z, [25, 75])
        v = ((q3 - q1) / 1.349) ** 2
        b = st.checks[i]
        a = max(1.0 / (b + 1.0), 1.0 / _POOL)
        cur = st.scale[i] ** 2 if b else v
        st.scale[i] = float(np.sqrt(max(1.0, cur + a * (v - cur))))
        st.checks[i] = b + 1


def _to_the_pack(st: ChangeState, base: np.ndarray, level: np.ndarray, cfg: DiagnoserConfig) -> np.ndarray:
    """Per series and rank: whether a rise is a rank coming back to its peers, no change: its
    baseline lay far on the fast side of theirs (under their lower fence, Q1 - 1.5 IQR, of
    the learned ranks' baselines) and the level it would open at (``base + level``, its size
    added) is within their upper fence. A rank faster than its peers while they warmed up learned that as its
    baseline, and its return to their pace opened a change, paged and held open for the rest
    of the job (three ranks of a quiet job of 1,024); a job waits for its slowest rank, so a
    rank that joins the pack costs it nothing."""
    out = np.zeros(base.shape, dtype=bool)
    for i in range(len(SERIES)):
        learned = (st.n[i] >= cfg.cp_learn) & (st.onset[i] < 0)
        if int(learned.sum()) < _POOL_MIN:
            continue
        q1, q3 = np.percentile(st.base[i, learned], [25, 75])
        out[i] = (base[i] < q1 - 1.5 * (q3 - q1)) & (base[i] + level[i] <= q3 + 1.5 * (q3 - q1))
    return out


def stirring(st: ChangeState, cfg: DiagnoserConfig) -> bool:
    """Whether some rank's own past shows a change, open or building (its opening sum at
    half its threshold or more): the job's step waits for its slowest rank, so a rise of it
    is theirs until their test has spoken (two of seven workers slowed 1.24x raised the
    typical rank's work, and the job was paged a step before their change opened)."""
    if not st.n_ranks:
        return False
    return bool((st.onset >= 0).any() or building(st, cfg).any())


def building(st: ChangeState, cfg: DiagnoserConfig) -> np.ndarray:
    """Per series and rank ((len(SERIES), n_ranks)), whether a change is open or building:
    its opening sum at half its threshold or more, over two deviations or more."""
    rho, _ = _rho(st, cfg, st.ac)
    h = _scales(st, slice(None), cfg, rho)[3]
    out: np.ndarray = (st.onset >= 0) | ((st.s >= h / 2) & (st.s_cnt >= 2))
    return out


_ONSET_Z = 4.0
"""Squared z of a CUSUM's onset bound (``spread``): about 95 % of onsets."""


def track(st: ChangeState, res: RankResiduals, step: int, cfg: DiagnoserConfig) -> ChangeStep:
    """Fold one step's residuals into ``st`` (in place): learn baselines, accumulate
    evidence, open and close changes. Ranks absent from the step keep their state.

    The test runs from ``cp_learn // 2`` samples on (``cp_learn`` where the ranks are
    enough to pool their autocorrelation); the baseline is learned (running mean
    and mean absolute deviation, a sample clipped at 3 sigma from the fourth on) until
    ``cp_learn``, from the samples that add no evidence, then followed slowly."""
    if not len(res.ranks):
        return ChangeStep()
    st.grow(int(res.ranks.max()) + 1)
    cols = res.ranks
    # the ranks' rows: a slice (views, no gathers) when the batch holds ranks 0..n-1 in order
    idx: np.ndarray | slice = cols
    if len(cols) and cols[0] == 0 and cols[-1] == len(cols) - 1 and bool(np.all(np.diff(cols) == 1)):
        idx = slice(0, len(cols))
    n = st.n[:, idx]
    ac = st.ac  # once a step: the noise model's autocorrelation, for every rank
    base = st.base[:, idx]
    own_sig = np.sqrt(st.v1[:, idx] / (2.0 * (1.0 - ac[:, idx])))
    small = len(cols) < cfg.small_job
    r = residuals(res, base, st.n_ranks if small else 0, st.base[0, st.n[0] > 0] if small else None)
    ok = np.isfinite(r)
    rho_all, typ_ac = _rho(st, cfg, ac)
    sig, k, c, h, lr = _scales(st, idx, cfg, rho_all)
    d = np.where(ok, r - base, 0.0)
    # (where the ranks are enough to pool, once their autocorrelation is the pooled one)
    many = ok.sum(axis=1, keepdims=True) >= _RHO_MIN
    ready = ok & (n >= np.where(many, cfg.cp_learn, cfg.cp_learn // 2))
    # the test runs on the deviation prewhitened by the rank's AR(1) (on the long-run
    # scale): a shock of autocorrelated noise is one large innovation, clipped once, and
    # its decay adds nothing; a sustained shift adds its size every step
    rho = rho_all[:, idx]
    follows = ok & (n >= 2) & (st.seen[:, idx] == step - 1)
    d_prev = st.prev[:, idx] - base
    u = np.where(follows, (d - rho * d_prev) / (1.0 - rho), d)
    _regress(st, idx, d, d_prev, follows & (st.onset[:, idx] < 0), own_sig, n, cfg)
    s, s_from = st.s[:, idx], st.s_from[:, idx]
    onset, size = st.onset[:, idx], st.size[:, idx]
    t, t_from = st.t[:, idx], st.t_from[:, idx]
    s_sum, s_cnt, c_sum = st.s_sum[:, idx], st.s_cnt[:, idx], st.c_sum[:, idx]
    csize = st.csize[:, idx]
    closed_now = ready & (onset < 0)
    # the opening CUSUM
    dc = np.clip(u, -c, c)
    # in a small job, where the own past leads, a shift of cp_small_shift or more adds that
    # much a step and opens in about three (a 1.86x sawtooth of 38 steps, four samples of a
    # log sampled by time, went unfound); among many ranks heavy tails near a unit root
    # paged three more times so
    fast = (
        np.minimum(np.maximum(u, -c), np.maximum(c, cfg.cp_small_shift + k))
        if len(cols) < cfg.small_job
        else dc
    )
    s_new = np.where(closed_now, np.maximum(s + fast - k, 0.0), 0.0)
    building = closed_now & (s_new > 0)
    fresh = building & (s <= 0)
    s_from = np.where(fresh, step, s_from)
    s_sum = np.where(building, np.where(fresh, 0.0, s_sum) + np.minimum(d, 4 * c), 0.0)
    s_cnt = np.where(building, np.where(fresh, 0.0, s_cnt) + 1.0, 0.0)
    c_sum = np.where(building, np.where(fresh, 0.0, c_sum) + dc, 0.0)
    # (the samples of the run that added evidence: two spikes of an evaluation four samples
    # apart are no shift)
    s_up = np.where(building, np.minimum(np.where(fresh, 0, st.s_up[:, idx]) + (fast > k), _MIN_RUN), 0)
    # a sharper sum (reference half the clip) places the onset: noise that rose a step or
    # two before a clear shift started the first sum there, not this one
    s2 = st.s2[:, idx]
    s2_new = np.where(closed_now, np.maximum(s2 + np.clip(d, -c, c) - c / 2, 0.0), 0.0)
    # (and a deviation of three clips or more, right after one under a clip and a sum of
    # under one clip, starts it anew: a clear shift begins there, not at the noise before
    # it; a rank 6x slower from step 30 under DDP was dated from a 1.3x blip at step 28 and
    # the step of noise after it. A sum grown further is a shift already: a heavy-tailed
    # spike seven steps into a 1.3x one moved its onset there; and a run whose level reached
    # three clips before is its pattern already: slow every other step moved it each beat)
    jump = closed_now & follows & (d >= 3 * c) & (d_prev < c) & (s2 < c) & (st.peak[:, idx] < 3 * c)
    s2_new = np.where(jump, c / 2, s2_new)
    s2_from = np.where(closed_now & (s2_new > 0) & ((s2 <= 0) | jump), step, st.s2_from[:, idx])
    # a shock of autocorrelated noise dying away is no change: the deviation's recent
    # level (EW) must hold at half the highest it reached since the sum left zero
    lvl = np.minimum(d, 4 * c)
    ew = np.where(building, np.where(fresh, lvl, st.ew[:, idx] + _FADE_ALPHA * (lvl - st.ew[:, idx])), 0.0)
    peak = np.where(building, np.where(fresh, ew, np.maximum(st.peak[:, idx], ew)), 0.0)
    st.ew[:, idx], st.peak[:, idx] = ew, peak
    # (and whatever the noise model's autocorrelation, a last deviation under half the
    # run's mean: two samples of a t(1.5) shock, 1.5x and 1.8x, then 1.2x and 1.07x, opened
    # a change in a small job, the noise model's autocorrelation under the gate; the mean,
    # not the peak, as one spike within a shift, 2.1x amid 1.35x, held a GPU straggler's
    # change shut to its end)
    # (or under half the last one: a shock of 1.5x, 2.2x, then 1.35x reached the evidence
    # on its fall; a step's wait, as a shift goes on)
    fading = (
        ((ew < _FADE * peak) & (np.maximum(rho, typ_ac).max(axis=0) >= _FADE_AC))
        | (lvl < _FALLEN * s_sum / np.maximum(s_cnt, 1.0))
        | (follows & ~fresh & (d < _FALLEN * d_prev))
    )
    due = closed_now & (s_new >= h) & (s_up >= _MIN_RUN)
    # (the peers' fences only on a step where some change would open)
    back = (
        due & _to_the_pack(st, base, s_sum / np.maximum(s_cnt, 1.0), cfg) if due.any() else np.zeros_like(due)
    )
    opens = due & ~fading & ~back
    _calibrate(st, idx, dc, ready, (onset >= 0) | opens, lr, step)
    # (the sharper sum's onset only for a change that drifts it up, its size a clip or more:
    # of a weaker one it is as likely zero as not, and dated a replica 1.07x from 20-40
    # steps into it, each rank at another step)
    sharp = (s2_new > 0) & (s_sum >= c * np.maximum(s_cnt, 1.0))
    onset = np.where(opens, np.where(sharp, s2_from, s_from), onset)
    # where the sum last left zero wanders as a walk of drift size - k and step lr does
    # after the true onset, which comes back to zero within about _ONSET_Z (lr / (size -
    # k))^2 steps: a strong change's onset is its step, a weak one's tens of steps late (a
    # replica 1.07x among AR(0.83) noise: its ranks' onsets 120 to 168 for a fault from 120)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        drift = np.maximum(s_sum / np.maximum(s_cnt, 1.0) - k, 1e-6)
        spread = np.minimum(_ONSET_Z * (lr / drift) ** 2, 127.0)
    st.lag[:, idx] = np.where(opens, np.minimum(step - onset, 127), st.lag[:, idx])
    st.spread[:, idx] = np.where(opens, np.round(np.nan_to_num(spread, nan=127.0)), st.spread[:, idx])
    size = np.where(opens, s_sum / np.maximum(s_cnt, 1.0), size)
    csize = np.where(opens, c_sum / np.maximum(s_cnt, 1.0), csize)
    t = np.where(opens, 0.0, t)
    # the closing CUSUM of an open change: its half size minus the deviation
    is_open = ready & (onset >= 0) & ~opens
    half = np.maximum(csize / 2, k)
    t_new = np.where(is_open, np.maximum(t + half - dc, 0.0), t)
    # a step at the change's full size again halves what that sum gathered: a rank flapping
    # off for 28 steps built a sum its next 18 steps on did not undo, the next stretch off
    # closed its change, and the hundreds of steps it flapped on were no fault
    t_new = np.where(is_open & (d >= size), t_new / 2, t_new)
    t_from = np.where(is_open & (t <= 0) & (t_new > 0), step, t_from)
    ends = is_open & (t_new >= np.maximum(2 * h, cfg.cp_end_steps * half))
    # an open change's size follows it while it holds (a ramp grows)
    holds = is_open & (t_new <= 0)
    size = np.where(holds, size + cfg.cp_size_alpha * (np.minimum(d, 4 * c) - size), size)
    csize = np.where(holds, csize + cfg.cp_size_alpha * (dc - csize), csize)
    # the baseline: learned, then followed slowly, from samples that add no evidence
    quiet = ok & (onset < 0) & ~opens & (s_new < h / 2)
    learning = quiet & (n < cfg.cp_learn)
    # followed from samples near it only: the reference's own shift (a replica mostly slowed
    # leaves its other ranks below their baselines) must not move it
    following = quiet & ~learning & (np.abs(d) <= 2 * sig)
    a = np.where(learning, 1.0 / (n + 1.0), np.where(following, cfg.cp_alpha, 0.0))
    lim = np.where(n >= 4, 3 * own_sig, np.inf)
    new_base = np.where(back, base + ew, base + a * np.clip(d, -lim, lim))  # its recent level
    s_new = np.where(back, 0.0, s_new)
    rhythm = st.period[0, cols] >= 0
    # (a change that opens in this step still lets its spike count: two workers 3.5x on
    # every other step, one's change opening as the other's rhythm did, were two anomalies)
    spike, hushed, due = _spikes(st, cols, d[0], closed_now[0], c[0], sig[0], step, cfg)
    # a change under test or open does not teach the rank's own noise model: a ramp's steady
    # rises read as autocorrelation in the differences, and two workers' 1.24x sawtooth took
    # theirs from 0.5 to 0.95 and their threshold twelvefold in fifteen steps, never to open
    # (or, open, closed mid-fault). (Not where the ranks pool their autocorrelation, which a
    # few ranks' ramps do not move: there heavy-tailed shocks, held out so, left the models
    # short and paged.)
    testing = ((closed_now & (s_new >= h / _TESTING)) | is_open) & ~many
    v1, v2 = _noise(st, idx, r, ok, n, cfg, ~quiet & ok, ac[:, idx], hushed[None, :], testing)
    # write back
    st.n[:, idx] = n + ok
    st.base[:, idx], st.v1[:, idx], st.v2[:, idx] = new_base, v1, v2
    st.prev2[:, idx] = np.where(ok, st.prev[:, idx], st.prev2[:, idx])
    st.prev[:, idx] = np.where(ok, r, st.prev[:, idx])
    st.s[:, idx], st.s_from[:, idx] = s_new, s_from
    st.s2[:, idx], st.s2_from[:, idx] = s2_new, s2_from
    st.s_sum[:, idx], st.s_cnt[:, idx], st.c_sum[:, idx] = s_sum, s_cnt, c_sum
    st.s_up[:, idx] = s_up
    st.csize[:, idx] = csize
    st.t[:, idx], st.t_from[:, idx] = np.where(ends, 0.0, t_new), t_from
    end_step = t_from - 1
    st.onset[:, idx] = np.where(ends, -1, onset)
    st.size[:, idx] = size
    st.seen[:, idx] = np.where(ok, step, st.seen[:, idx])
    _periodic(st, cols, spike, due, d[0], step, cfg)
    oi, oj = np.nonzero(opens)
    # the phase that rose when a change opened, or on the spike that made a rhythm (a log's
    # slow every fifth step was a compute straggler there, unknown to the step's own test:
    # two anomalies of one fault)
    rose = np.union1d(oj, np.flatnonzero((st.period[0, cols] >= 0) & ~rhythm))
    if len(rose):
        st.phase[cols[rose]] = res.phase[rose]
    ci, cj = np.nonzero(ends)
    return ChangeStep(
        tuple((int(cols[j]), int(i)) for i, j in zip(oi.tolist(), oj.tolist(), strict=True)),
        tuple(
            (int(cols[j]), int(i), int(end_step[i, j])) for i, j in zip(ci.tolist(), cj.tolist(), strict=True)
        ),
    )
