"""Diagnosis from logs: one value per (rank, time or step), sampled irregularly.

For people who only have logs (``argus diagnose --steps-csv``): rows are binned into
windows (steps when a step column is given; otherwise bins of the ranks' median sampling
interval), each rank's value averaged per window, then every window's ranks are compared
with robust z-scores (ranks that start or stop late simply miss windows), and the job's
median per window is compared with its own recent past.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._classes import (
    CHECKPOINT_STALL,
    COMPUTE_STRAGGLER,
    DATALOADER_STALL,
    GC_PAUSE,
    JIT_COMPILE_STALL,
    LINK_DEGRADATION,
    PIPELINE_BUBBLE,
    UNKNOWN,
)
from ._robust import MAD_TO_SIGMA, GroupIndex, group_median_scale

__all__ = ["SeriesAnomaly", "cause_of_metric", "diagnose_series"]

_NAME_HINTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("compile", "jit"), JIT_COMPILE_STALL),
    (("checkpoint", "ckpt"), CHECKPOINT_STALL),
    (("dataloader", "data_loader", "loader", "input_wait"), DATALOADER_STALL),
    (("gc",), GC_PAUSE),
    (("p2p", "bubble", "pipeline"), PIPELINE_BUBBLE),
    (
        ("all_reduce", "allreduce", "all_gather", "reduce_scatter", "nccl", "comm", "collective"),
        LINK_DEGRADATION,
    ),
    (("forward", "backward", "compute", "fwd", "bwd", "gemm", "kernel"), COMPUTE_STRAGGLER),
)


def cause_of_metric(name: str) -> str:
    """The class a rank's excess in a metric of this name points to (``unknown`` if the
    name says nothing, e.g. a bare step time)."""
    low = name.lower()
    for hints, cause in _NAME_HINTS:
        if any(h in low for h in hints):
            return cause
    return UNKNOWN


@dataclass(frozen=True)
class SeriesAnomaly:
    """An anomalous window: ``rank`` (None for the whole job), first and last window start
    in the input's time or step unit, the class, the score (max |robust z|), the number of
    flagged windows, the rank's (or job's) and the reference median value, and the
    window indexes."""

    rank: int | None
    start: float
    end: float
    cause: str
    score: float
    windows: int
    value: float
    reference: float
    first_bin: int = -1
    last_bin: int = -1


def _bins(t: np.ndarray, rank_idx: np.ndarray, by_time: bool) -> tuple[np.ndarray, np.ndarray]:
    """Window index per row, and the start label of every window."""
    if not by_time:
        labels, inv = np.unique(t, return_inverse=True)
        return inv.astype(np.int64), labels.astype(float)
    order = np.lexsort((t, rank_idx))
    dt = np.diff(t[order])
    same = rank_idx[order][1:] == rank_idx[order][:-1]
    gaps = dt[same & (dt > 0)]
    width = float(np.median(gaps)) if len(gaps) else max(float(t.max() - t.min()), 1.0)
    t0 = float(t.min())
    idx = np.floor((t - t0) / width + 1e-9).astype(np.int64)
    labels_all = t0 + width * np.arange(int(idx.max()) + 1)
    used, inv = np.unique(idx, return_inverse=True)
    return inv.astype(np.int64), labels_all[used]


def _merge(flag_bins: np.ndarray, gap: int) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for b in np.sort(flag_bins).tolist():
        if runs and b - runs[-1][1] <= gap + 1:
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((b, b))
    return runs


def diagnose_series(
    rank: np.ndarray,
    t: np.ndarray,
    value: np.ndarray,
    *,
    by_time: bool,
    metric: str = "value",
    higher_is_better: bool = False,
    z: float = 6.0,
    rel: float = 0.1,
    min_ranks: int = 4,
    gap: int = 1,
) -> list[SeriesAnomaly]:
    """Anomalous windows and suspect ranks of a long-format series.

    Args:
        rank, t, value: one entry per row (t: time or step number).
        by_time: True if ``t`` is a time (binned at the median sampling interval), False
            if it is a step number (one window per distinct step).
        metric: the value's name (hints the class, see :func:`cause_of_metric`).
        higher_is_better: the value is a throughput (a slow rank has a low value).
        z, rel: a window of a rank is flagged when its robust z-score within the window
            reaches ``z`` and it differs from the window's median by ``rel`` of it.
        min_ranks: windows with fewer ranks are not compared.
        gap: flagged windows this far apart merge into one anomaly.

    Raises:
        ValueError: arrays of different lengths or no finite rows.
    """
    rank = np.asarray(rank)
    t = np.asarray(t, float)
    v = np.asarray(value, float)
    if not len(rank) == len(t) == len(v):
        raise ValueError("rank, time and value columns differ in length")
    ok = np.isfinite(t) & np.isfinite(v)
    rank, t, v = rank[ok], t[ok], v[ok]
    if len(v) == 0:
        raise ValueError("no rows with a finite time and value")
    ranks, rank_idx = np.unique(rank, return_inverse=True)
    win, labels = _bins(t, rank_idx, by_time)
    nb = len(labels)
    cell = rank_idx.astype(np.int64) * nb + win
    cells, cinv = np.unique(cell, return_inverse=True)
    mean = np.bincount(cinv, weights=v) / np.bincount(cinv)
    c_rank, c_win = cells // nb, cells % nb
    sign = -1.0 if higher_is_better else 1.0
    gi = GroupIndex.of(c_win)
    med, scale = group_median_scale(
        mean[None, :], gi, floor_abs=1e-9 * max(float(np.median(np.abs(mean))), 1.0), floor_rel=0.005
    )
    size = gi.sizes[gi.inverse]
    m = med[0, gi.inverse]
    zs = sign * (mean - m) / scale[0, gi.inverse]
    big = sign * (mean - m) >= rel * np.abs(m)
    flagged = (zs >= z) & big & (size >= min_ranks)
    job = _job_windows(gi.keys, med[0], gi.sizes, labels, sign, z, rel, min_ranks, gap)
    flagged &= ~_like_job_slowdown(c_win, mean, job, rel)
    cause = cause_of_metric(metric)
    out: list[SeriesAnomaly] = list(job)
    for ri in np.unique(c_rank[flagged]).tolist():
        sel = flagged & (c_rank == ri)
        for a, b in _merge(c_win[sel], gap):
            span = sel & (c_win >= a) & (c_win <= b)
            out.append(
                SeriesAnomaly(
                    rank=_plain(ranks[ri]),
                    start=float(labels[a]),
                    end=float(labels[b]),
                    cause=cause,
                    score=round(float(zs[span].max()), 4),
                    windows=int(span.sum()),
                    value=float(np.median(mean[span])),
                    reference=float(np.median(m[span])),
                    first_bin=a,
                    last_bin=b,
                )
            )
    out.sort(key=lambda a: (a.start, -1 if a.rank is None else a.rank))
    return out


def _like_job_slowdown(
    c_win: np.ndarray, mean: np.ndarray, job: list[SeriesAnomaly], rel: float
) -> np.ndarray:
    """Cells next to a job-wide anomalous window whose value is the job's anomalous level:
    with irregular sampling, a window straddling the job's change splits its ranks in two."""
    out = np.zeros(len(mean), bool)
    for a in job:
        near = (c_win >= a.first_bin - 1) & (c_win <= a.last_bin + 1)
        out |= near & (np.abs(mean - a.value) <= rel * abs(a.value))
    return out


def _plain(r: object) -> int:
    return int(r)  # type: ignore[call-overload,no-any-return]


def _job_windows(
    keys: np.ndarray,
    med: np.ndarray,
    sizes: np.ndarray,
    labels: np.ndarray,
    sign: float,
    z: float,
    rel: float,
    min_ranks: int,
    gap: int,
    history: int = 16,
    min_history: int = 8,
) -> list[SeriesAnomaly]:
    """Windows whose median over ranks rose above the job's own recent clean past."""
    clean: list[float] = []
    flagged: list[int] = []
    scores: dict[int, float] = {}
    refs: dict[int, float] = {}
    for key, mv, n in zip(keys.tolist(), med.tolist(), sizes.tolist(), strict=True):
        if n < min_ranks:
            continue
        if len(clean) >= min_history:
            w = np.array(clean[-history:])
            base = float(np.median(w))
            sigma = max(MAD_TO_SIGMA * float(np.median(np.abs(w - base))), 0.005 * abs(base), 1e-9)
            zz = sign * (mv - base) / sigma
            if zz >= z and sign * (mv - base) >= rel * abs(base):
                flagged.append(int(key))
                scores[int(key)] = zz
                refs[int(key)] = base
                continue
        clean.append(mv)
    out = []
    for a, b in _merge(np.array(flagged, np.int64), gap):
        ks = [k for k in flagged if a <= k <= b]
        out.append(
            SeriesAnomaly(
                None,
                float(labels[a]),
                float(labels[b]),
                UNKNOWN,
                round(max(scores[k] for k in ks), 4),
                len(ks),
                float(np.median([med[list(keys).index(k)] for k in ks])),
                refs[ks[0]],
                a,
                b,
            )
        )
    return out
