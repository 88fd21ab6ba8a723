"""Cross-rank level: per step, robust z-scores of every phase within the layout's groups.

Metric first: :func:`rank_metrics` turns a :class:`schemas.StepBatch` into a matrix of
per-rank metrics; :func:`cross_rank` scores every rank against its group (a pp stage is
compared with itself, so a dp replica meets its peers) and keeps the few flagged ranks.
The decision (which cause) is :mod:`detectors.rootcause`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from argus.schemas import StepBatch

from ._config import DiagnoserConfig
from ._robust import GroupIndex, group_median_scale, is_identity

__all__ = [
    "CAUSE_METRICS",
    "COLLECTIVE_METRICS",
    "LINK_METRICS",
    "METRICS",
    "OWN_WORK",
    "WORK_METRICS",
    "CrossRankResult",
    "clean_step_ms",
    "cross_rank",
    "job_reference",
    "rank_metrics",
]

METRICS: tuple[str, ...] = (
    "compute_ms",
    "collective_ms",
    "dataloader_ms",
    "h2d_ms",
    "gc_ms",
    "compile_ms",
    "checkpoint_ms",
    "all_reduce_ms",
    "gather_scatter_ms",
    "all_to_all_ms",
    "p2p_ms",
    "tokens",
    "unaccounted_ms",
)
"""Per-rank metrics: compute = forward + backward + optimizer; collective = all collective
kinds; gather_scatter = all-gather + reduce-scatter + broadcast; unaccounted = step wall
time minus every timed phase (a CPU blocked outside the timers)."""
CAUSE_METRICS: tuple[str, ...] = tuple(m for m in METRICS if m not in ("collective_ms", "tokens"))
"""Metrics whose excess on a rank can be a cause (a positive outlier). Time outside every
timer is one: a masked straggler's GPU time when its peers wait for it, or the whole step
when a log has nothing else."""
LINK_METRICS = frozenset({"all_reduce_ms", "gather_scatter_ms", "all_to_all_ms", "p2p_ms"})
_IDX = {name: i for i, name in enumerate(METRICS)}
_CAUSE_ROWS = np.array([_IDX[n] for n in CAUSE_METRICS])
_FLOOR = np.array([0.5 if n != "tokens" else 1.0 for n in METRICS])
OWN_WORK: tuple[str, ...] = ("compute_ms", "dataloader_ms", "h2d_ms", "gc_ms", "compile_ms", "unaccounted_ms")
"""A rank's own work in a step, its checkpoint aside: what a global slowdown raises on every rank."""
WORK_METRICS = frozenset({*OWN_WORK, "checkpoint_ms", "tokens"})
"""A rank's own work: only a slow minority stands out (centre and scale from the fast side).
Collective time holds the wait for the slowest, so most ranks of a slowed job are high
there: its centre stays the median."""
_ONE_SIDED = np.array([n in WORK_METRICS for n in METRICS])
_WAITS = np.array([n == "collective_ms" for n in METRICS])
_LINK_ROWS = np.array([i for i, n in enumerate(METRICS) if n in LINK_METRICS])
COLLECTIVE_METRICS = ("collective_ms", "all_reduce_ms", "gather_scatter_ms", "all_to_all_ms", "p2p_ms")
_COLL_ROWS = np.array([METRICS.index(n) for n in COLLECTIVE_METRICS])


_STEP_PARTS = np.array([METRICS.index(m) for m in (*OWN_WORK, "checkpoint_ms", *sorted(LINK_METRICS))])


def clean_step_ms(reference: np.ndarray) -> float:
    """The job's step without the wait for its slowest rank (from :func:`job_reference`):
    the typical rank's own work and checkpoint plus the fastest ranks' collectives. The
    iteration level's signal: the wall time's heavy tail is the slowest rank's, which the
    cross-rank level already judges."""
    return float(reference[_STEP_PARTS].sum())


def job_reference(cr: CrossRankResult) -> np.ndarray:
    """The job's level of every metric for the iteration level: the median for a rank's own
    work, the least over ranks for collectives (without the wait for the slowest)."""
    ref = cr.job_median.copy()
    ref[_COLL_ROWS] = cr.collective_floor
    return ref


def rank_metrics(batch: StepBatch) -> tuple[np.ndarray, np.ndarray]:
    """The (len(METRICS), n) metric matrix of a batch, and every rank's step wall time (ms)."""
    c = batch.columns
    step_ms = (c["end_ns"] - c["start_ns"]) / 1e6
    compute = c["forward_ms"] + c["backward_ms"] + c["optimizer_ms"]
    gs = c["all_gather_ms"] + c["reduce_scatter_ms"] + c["broadcast_ms"]
    coll = c["all_reduce_ms"] + gs + c["all_to_all_ms"] + c["p2p_ms"]
    timed = (
        compute + coll + c["dataloader_ms"] + c["h2d_ms"] + c["gc_ms"] + c["compile_ms"] + c["checkpoint_ms"]
    )
    x = np.empty((len(METRICS), len(batch)))
    x[0], x[1] = compute, coll
    for name in ("dataloader_ms", "h2d_ms", "gc_ms", "compile_ms", "checkpoint_ms", "all_reduce_ms"):
        x[_IDX[name]] = c[name]
    x[_IDX["gather_scatter_ms"]] = gs
    x[_IDX["all_to_all_ms"]] = c["all_to_all_ms"]
    x[_IDX["p2p_ms"]] = c["p2p_ms"]
    x[_IDX["tokens"]] = c["tokens"]
    x[_IDX["unaccounted_ms"]] = np.maximum(step_ms - timed, 0.0)
    return x, step_ms


@dataclass(frozen=True, eq=False)
class CrossRankResult:
    """Cross-rank scores of one step, kept only for the flagged ranks.

    ``rows``/``ranks``: the flagged ranks (batch rows and rank ids); ``z``, ``excess`` and
    ``value``: their (len(METRICS), k) z-scores, excess over the group median and values;
    ``pos``: (len(METRICS), k) positive flags (only cause metrics and tokens); ``waits_least``:
    (k,) the rank's collective time is far below its group's. ``group_keys`` and
    ``group_median``/``group_sizes``: per group (e.g. per pp stage) centres of every metric;
    ``job_median``: per metric, the median over ranks; ``step_ms``: the job's
    median step wall time; ``collective_floor``: per ``COLLECTIVE_METRICS``, the least
    over ranks; ``min_excess_ms``: the excess a flag needed; ``weak``: ranks
    (not flagged) that reached ``weak_frac`` of a threshold, enough to keep an open
    episode of theirs going (hysteresis), never to start one.
    """

    step_ms: float
    min_excess_ms: float
    n_ranks: int
    rows: np.ndarray
    ranks: np.ndarray
    groups: np.ndarray
    z: np.ndarray
    excess: np.ndarray
    value: np.ndarray
    pos: np.ndarray
    waits_least: np.ndarray
    group_keys: np.ndarray
    group_median: np.ndarray
    group_sizes: np.ndarray
    job_median: np.ndarray
    weak: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    collective_floor: np.ndarray = field(default_factory=lambda: np.zeros(len(COLLECTIVE_METRICS)))

    def metric(self, name: str) -> int:
        """Row of ``name`` in the metric arrays."""
        return _IDX[name]


def cross_rank(batch: StepBatch, config: DiagnoserConfig | None = None) -> CrossRankResult:
    """Score every rank of one step within its group and keep the flagged ones.

    Args:
        batch: one step of one job (any subset of ranks, any order).
        config: thresholds (``z_pos``, ``z_neg``, ``min_excess_*``, ``group_column``).

    Returns:
        A :class:`CrossRankResult` with the flagged ranks' scores and the group medians.

    Notes:
        In a synchronous step every rank's wall time is the same, so the step time says
        nothing about who is slow; the phases do. A rank's excess in a phase is measured
        against the centre of its group (the same pp stage: same model layers), scaled by
        the group's spread: for a rank's own work both from the group's fast side, so that
        many slow ranks at once do not hide each other; for collectives the median and MAD.
    """
    cfg = config or DiagnoserConfig()
    x, step_ms = rank_metrics(batch)
    gi = GroupIndex.of(batch[cfg.group_column])
    ident = is_identity(gi.order)
    xs = x if ident else x[:, gi.order]  # rows sorted by group; ours to change in place
    med, scale = group_median_scale(
        xs,
        gi,
        floor_abs=_FLOOR,
        max_sample=cfg.max_sample,
        presorted=True,
        one_sided=_ONE_SIDED,
        waits=_WAITS,
    )
    job_step, job_median, floor = _job_levels(xs, step_ms)
    thr, neg, min_excess = _thresholds(med, scale, cfg)
    rep = np.repeat(np.arange(gi.n_groups), gi.sizes)  # group of every sorted row
    _without_early_wait(xs, med, rep)
    ratio = _ratio(xs, med, thr, neg, gi, rep)
    flagged_sorted = np.flatnonzero(ratio >= 1.0)
    weak_sorted = np.flatnonzero((ratio >= cfg.weak_frac) & (ratio < 1.0))[: cfg.max_weak]
    weak_rows = gi.order[weak_sorted] if not ident else weak_sorted
    rows = gi.order[flagged_sorted] if not ident else flagged_sorted
    gidx = rep[flagged_sorted]
    value = xs[:, flagged_sorted]
    excess = value - med[:, gidx]
    pos, waits_least = _flags(excess, thr, neg, gidx)
    return CrossRankResult(
        step_ms=job_step,
        min_excess_ms=min_excess,
        n_ranks=len(batch),
        rows=rows,
        ranks=batch["rank"][rows],
        groups=batch[cfg.group_column][rows],
        z=excess / scale[:, gidx],
        excess=excess,
        value=value,
        pos=pos,
        waits_least=waits_least,
        weak=batch["rank"][weak_rows],
        group_keys=gi.keys,
        group_median=med,
        group_sizes=gi.sizes,
        job_median=job_median,
        collective_floor=floor,
    )


def _typical(x: np.ndarray) -> np.ndarray:
    """Per row, the median over ranks; of two ranks the lower (the mean of two would be half
    a late rank's, and that rank alone would make the step look like everyone's)."""
    return np.asarray(x.min(axis=1) if x.shape[1] == 2 else np.median(x, axis=1))


def _job_levels(xs: np.ndarray, step_ms: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """The job's median step wall time and typical value of every metric (:func:`_typical`,
    over a strided sample of about 4,096 ranks), and per ``COLLECTIVE_METRICS`` the least
    collective time of any rank: the slowest rank's, which waits for nobody, so transfer and
    pipeline bubbles without the wait for the slowest (every step's heavy tail)."""
    stride = max(1, len(step_ms) // 4096)
    job_step = float(np.median(step_ms[::stride]))
    job_median = _typical(xs[:, ::stride]) if len(step_ms) else np.zeros(len(METRICS))
    floor = xs[_COLL_ROWS].min(axis=1) if len(step_ms) else np.zeros(len(_COLL_ROWS))
    return job_step, job_median, floor


def _thresholds(
    med: np.ndarray, scale: np.ndarray, cfg: DiagnoserConfig
) -> tuple[np.ndarray, np.ndarray, float]:
    """Per metric and group, the excess over the group's centre that flags a rank; per group,
    the shortfall of collective time that does (a rank that waits least); the least excess
    (ms). They scale with the typical rank's own work, not with a step a stall inflated."""
    busy = float(np.median(med[_IDX["compute_ms"]] + med[_IDX["dataloader_ms"]] + med[_IDX["h2d_ms"]]))
    un = _IDX["unaccounted_ms"]
    untimed = not np.any(med[:un] > 0)  # a log with a step time only: nothing else to go by
    if untimed:
        busy = float(np.median(med[un]))
    min_excess = max(cfg.min_excess_ms, cfg.min_excess_frac * busy)
    thr = np.maximum(cfg.z_pos * scale, min_excess)
    if not untimed:  # time outside the timers of a timed job is host overhead, not a cause
        thr[un] = np.inf
    tok, coll = _IDX["tokens"], _IDX["collective_ms"]
    thr[tok] = np.maximum(cfg.z_pos * scale[tok], (cfg.tokens_ratio - 1.0) * med[tok])
    neg = np.maximum(cfg.z_neg * scale[coll], max(cfg.neg_min_frac * busy, min_excess))
    ck = _IDX["checkpoint_ms"]  # a checkpoint stall is a checkpoint far slower than its peers'
    thr[ck] = np.maximum(thr[ck], (cfg.checkpoint_ratio - 1.0) * med[ck])
    return thr, neg, min_excess


def _without_early_wait(xs: np.ndarray, med: np.ndarray, rep: np.ndarray) -> None:
    """A rank that computed faster than its group waits longer for the others: that wait is
    not its link's transfer time (taken off its link metrics, in place)."""
    comp = _IDX["compute_ms"]
    xs[_LINK_ROWS] += np.minimum(xs[comp] - med[comp, rep], 0.0)


def _ratio(
    xs: np.ndarray, med: np.ndarray, thr: np.ndarray, neg: np.ndarray, gi: GroupIndex, rep: np.ndarray
) -> np.ndarray:
    """Per (group-sorted) rank, how far it is out: the largest excess of a cause metric over
    its threshold, or of its group's collective time over its own (1: flagged)."""
    coll = _IDX["collective_ms"]
    ratio: np.ndarray
    if gi.n_groups and np.all(gi.sizes == gi.sizes[0]):  # broadcast, no gathers
        m, g, size = len(METRICS), gi.n_groups, int(gi.sizes[0])
        cube = xs.reshape(m, g, size)
        ratio = ((cube[_CAUSE_ROWS] - med[_CAUSE_ROWS, :, None]) / thr[_CAUSE_ROWS, :, None]).max(axis=0)
        ratio = np.maximum(ratio, (med[coll, :, None] - cube[coll]) / neg[:, None]).reshape(-1)
    else:
        ratio = ((xs[_CAUSE_ROWS] - med[_CAUSE_ROWS][:, rep]) / thr[_CAUSE_ROWS][:, rep]).max(axis=0)
        ratio = np.maximum(ratio, (med[coll][rep] - xs[coll]) / neg[rep])
    return ratio


def _flags(
    excess: np.ndarray, thr: np.ndarray, neg: np.ndarray, gidx: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Of the flagged ranks (their groups ``gidx``): which metrics are out on the high side
    (cause metrics and tokens), and whether the rank waits least in collectives."""
    tok = _IDX["tokens"]
    pos = np.zeros((len(METRICS), excess.shape[1]), bool)
    pos[_CAUSE_ROWS] = excess[_CAUSE_ROWS] >= thr[_CAUSE_ROWS][:, gidx]
    pos[tok] = excess[tok] >= thr[tok][gidx]
    waits_least = excess[_IDX["collective_ms"]] <= -neg[gidx]
    return pos, waits_least
