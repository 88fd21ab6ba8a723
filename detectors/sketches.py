"""The decode side of kernel sketches: each kernel's duration distribution from
:class:`~schemas.KernelStats` (quantiles, CDF), and merging stats across steps and ranks.

The model of a kernel's distribution is the piecewise-linear quantile function through
``(0, min)``, ``(p_j, q_j)`` for the stored probabilities, and ``(1, max)`` — numpy's
linear-interpolation quantiles between the stored points. Merging builds the count-weighted
mixture of these distributions and reads its quantiles back (pure numpy, no I/O).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from argus.schemas import KernelStats

__all__ = ["cdf", "knots", "mean_ns", "merge", "quantiles"]

_EXACT_KNOTS = 4096  # merges with fewer knots than this are exact on the model
_GRID = 2048


def knots(stats: KernelStats) -> tuple[np.ndarray, np.ndarray]:
    """The quantile function's knots: probabilities (q+2,) and values (k, q+2), monotone."""
    p = np.concatenate(([0.0], np.asarray(stats.probs, np.float64), [1.0]))
    v = np.column_stack(
        [
            stats.min_ns.astype(np.float64),
            np.asarray(stats.quantiles_ns, np.float64),
            stats.max_ns.astype(np.float64),
        ]
    )
    return p, np.maximum.accumulate(v, axis=1)


def quantiles(stats: KernelStats, probs: Sequence[float] | np.ndarray) -> np.ndarray:
    """Duration quantiles (ns) of every kernel at ``probs``: shape (k, len(probs))."""
    want = np.clip(np.asarray(probs, np.float64), 0.0, 1.0)
    p, v = knots(stats)
    j = np.clip(np.searchsorted(p, want, side="right") - 1, 0, len(p) - 2)
    w = (want - p[j]) / (p[j + 1] - p[j])
    out: np.ndarray = v[:, j] + w[None, :] * (v[:, j + 1] - v[:, j])
    return out


def _cdf_rows(p: np.ndarray, v: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P(duration <= x) for each row of knots ``v`` at the points ``x``: shape (rows, len(x))."""
    out = np.empty((len(v), len(x)))
    for lo in range(0, len(v), 256):
        vv = v[lo : lo + 256]
        j = (x[None, :, None] >= vv[:, None, :]).sum(axis=2) - 1  # last knot <= x
        inside = (j >= 0) & (j < len(p) - 1)
        jj = np.clip(j, 0, len(p) - 2)
        v0 = np.take_along_axis(vv, jj, axis=1)
        v1 = np.take_along_axis(vv, jj + 1, axis=1)
        span = v1 - v0
        frac = np.divide(x[None, :] - v0, span, out=np.ones_like(span), where=span > 0)
        val = p[jj] + np.clip(frac, 0.0, 1.0) * (p[jj + 1] - p[jj])
        out[lo : lo + 256] = np.where(j < 0, 0.0, np.where(inside, val, 1.0))
    return out


def cdf(stats: KernelStats, values_ns: Sequence[float] | np.ndarray) -> np.ndarray:
    """P(duration <= value) of every kernel at ``values_ns``: shape (k, len(values_ns))."""
    p, v = knots(stats)
    return _cdf_rows(p, v, np.asarray(values_ns, np.float64))


def mean_ns(stats: KernelStats) -> np.ndarray:
    """Exact mean duration of every kernel (total / count)."""
    out: np.ndarray = stats.total_ns / np.maximum(stats.count, 1)
    return out


def _mixture_quantiles(p: np.ndarray, v: np.ndarray, weight: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Quantiles of the weighted mixture of the rows' piecewise-linear distributions."""
    if len(v) == 1:
        j = np.clip(np.searchsorted(p, want, side="right") - 1, 0, len(p) - 2)
        w = (want - p[j]) / (p[j + 1] - p[j])
        one: np.ndarray = v[0, j] + w * (v[0, j + 1] - v[0, j])
        return one
    if v.size <= _EXACT_KNOTS:
        grid = np.unique(v)
    else:
        lo, hi = max(v.min(), 1.0), max(v.max(), 1.0)
        grid = np.unique(np.concatenate(([v.min()], np.geomspace(lo, hi, _GRID))))
    f = (weight[:, None] * _cdf_rows(p, v, grid)).sum(axis=0) / weight.sum()
    f = np.maximum.accumulate(f)
    # invert the non-decreasing piecewise-linear F: the smallest x with F(x) >= want
    k = np.clip(np.searchsorted(f, want, side="left"), 1, len(grid) - 1)
    f0, f1 = f[k - 1], f[k]
    frac = np.divide(want - f0, f1 - f0, out=np.zeros_like(want), where=f1 > f0)
    out: np.ndarray = grid[k - 1] + np.clip(frac, 0.0, 1.0) * (grid[k] - grid[k - 1])
    return np.where(want <= f[0], grid[0], out)


def merge(parts: Sequence[KernelStats], probs: Sequence[float] | np.ndarray | None = None) -> KernelStats:
    """Merge stats of several steps and/or ranks into one (e.g. a baseline or a consensus).

    Counts, totals, min, max and idle times add up exactly (idle per stream id); the
    quantiles (at ``probs``, default the first part's) are those of the count-weighted
    mixture of the parts' distributions.
    """
    if not parts:
        raise ValueError("merge needs at least one KernelStats")
    want = np.asarray(parts[0].probs if probs is None else probs, np.float64)
    ids = np.concatenate([s.ids for s in parts]).astype(np.int64)
    count = np.concatenate([s.count for s in parts])
    total = np.concatenate([s.total_ns for s in parts])
    lo = np.concatenate([s.min_ns for s in parts])
    hi = np.concatenate([s.max_ns for s in parts])
    uniq, inv = np.unique(ids, return_inverse=True)
    k = len(uniq)
    out_count = np.bincount(inv, weights=count, minlength=k).astype(np.int64)
    out_total = np.zeros(k, np.int64)
    np.add.at(out_total, inv, total)
    out_min = np.full(k, np.iinfo(np.int64).max)
    np.minimum.at(out_min, inv, lo)
    out_max = np.zeros(k, np.int64)
    np.maximum.at(out_max, inv, hi)
    q = np.zeros((k, len(want)))
    same_probs = all(np.array_equal(s.probs, parts[0].probs) for s in parts)
    if same_probs:
        p, v = knots(
            KernelStats(
                ids, count, total, lo, hi, parts[0].probs, np.concatenate([s.quantiles_ns for s in parts])
            )
        )
        rows = [(p, v)]
    else:
        rows = [knots(s) for s in parts]
    order = np.argsort(inv, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(inv, minlength=k))))
    for g in range(k):
        sel = order[bounds[g] : bounds[g + 1]]
        if same_probs:
            q[g] = _mixture_quantiles(rows[0][0], rows[0][1][sel], count[sel].astype(np.float64), want)
        else:
            q[g] = _merge_mixed(parts, ids, sel, want)
    sids = np.concatenate([s.stream_ids for s in parts]).astype(np.int64)
    idle = np.concatenate([s.idle_ns for s in parts])
    suniq, sinv = np.unique(sids, return_inverse=True)
    sidle = np.zeros(len(suniq), np.int64)
    np.add.at(sidle, sinv, idle)
    return KernelStats(
        ids=uniq.astype(np.int32),
        count=out_count,
        total_ns=out_total,
        min_ns=out_min,
        max_ns=out_max,
        probs=want,
        quantiles_ns=np.clip(q, out_min[:, None], out_max[:, None]),
        stream_ids=suniq.astype(np.int32),
        idle_ns=sidle,
    )


def _merge_mixed(
    parts: Sequence[KernelStats], ids: np.ndarray, sel: np.ndarray, want: np.ndarray
) -> np.ndarray:
    """Mixture quantiles when the parts store different probabilities: resample each part."""
    fine = np.linspace(0.0, 1.0, 101)
    offsets = np.cumsum([0] + [len(s) for s in parts])
    vals, weights = [], []
    for r in sel.tolist():
        part = int(np.searchsorted(offsets, r, side="right") - 1)
        s = parts[part]
        row = r - offsets[part]
        vals.append(quantiles(s, fine)[row])
        weights.append(float(s.count[row]))
    return _mixture_quantiles(fine, np.array(vals), np.array(weights), want)
