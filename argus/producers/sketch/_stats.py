"""Raw kernel events of one step → :class:`~schemas.KernelStats` (pure numpy, one sort)."""

from __future__ import annotations

import numpy as np

from argus.schemas import KernelStats
from argus.schemas.kernel_codec import DEFAULT_PROBS

__all__ = ["ALL_STREAMS", "kernel_stats", "stream_idle"]

ALL_STREAMS = -1
"""Stream id under which :func:`kernel_stats` reports the device-wide idle time (all streams)."""

_SHIFT = 40  # durations and relative start times below 2**40 ns (18 minutes) share a sort key


def _group_bounds(sorted_keys: np.ndarray) -> np.ndarray:
    """Start index of each run of equal keys, plus the end."""
    change = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    return np.concatenate(([0], change, [len(sorted_keys)]))


def _busy_gaps(start: np.ndarray, end: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Idle ns before each interval within its group (intervals sorted by group, then start)."""
    # offset each group far apart so one running max serves all groups
    span = int(max(end.max() - start.min(), 1)) + 1
    off = (group - group.min()) * span
    s, e = start - start.min() + off, end - start.min() + off
    run_end = np.maximum.accumulate(e)
    gaps = np.zeros(len(s), np.int64)
    gaps[1:] = np.maximum(s[1:] - run_end[:-1], 0)
    gaps[1:][group[1:] != group[:-1]] = 0
    return gaps


def stream_idle(
    start_ns: np.ndarray, end_ns: np.ndarray, stream_ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """GPU idle time between kernels per stream, and over all streams (id :data:`ALL_STREAMS`).

    Idle is the time between the first kernel start and the last kernel end (of the stream,
    or of the device) not covered by any kernel.
    """
    start = np.asarray(start_ns, np.int64)
    end = np.asarray(end_ns, np.int64)
    streams = np.asarray(stream_ids, np.int64)
    if len(start) == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int64)
    rel = start - start.min()
    order = np.argsort(
        (streams - streams.min()) << _SHIFT | np.minimum(rel, (1 << _SHIFT) - 1), kind="stable"
    )
    st = streams[order]
    gaps = _busy_gaps(start[order], end[order], st)
    bounds = _group_bounds(st)
    per_stream = np.add.reduceat(gaps, bounds[:-1])
    ids = st[bounds[:-1]]
    order_all = np.argsort(start, kind="stable")
    device = _busy_gaps(start[order_all], end[order_all], np.zeros(len(start), np.int64)).sum()
    return (
        np.concatenate(([ALL_STREAMS], ids)).astype(np.int32),
        np.concatenate(([device], per_stream)).astype(np.int64),
    )


def kernel_stats(
    name_ids: np.ndarray,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    stream_ids: np.ndarray | None = None,
    *,
    probs: np.ndarray = DEFAULT_PROBS,
) -> KernelStats:
    """Per-kernel statistics of one step from its raw kernel events.

    Args:
        name_ids: interned kernel-name id of each event (see :class:`NameInterner`).
        start_ns, end_ns: GPU start and end of each event, ns (any common origin).
        stream_ids: CUDA stream of each event; None skips the idle times.
        probs: quantile probabilities to keep.

    Returns:
        KernelStats with exact count, total, min and max per kernel and the duration
        quantiles at ``probs`` (numpy's default linear interpolation between order statistics).

    Notes:
        One sort of a combined (id, duration) key; everything else is vectorized. A duration
        at or above 2**40 ns (18 minutes) is clipped in the sort key only.
    """
    ids = np.asarray(name_ids, np.int64)
    dur = np.asarray(end_ns, np.int64) - np.asarray(start_ns, np.int64)
    if len(ids) != len(dur):
        raise ValueError("name_ids and start/end differ in length")
    if len(dur) and dur.min() < 0:
        raise ValueError("a kernel ends before it starts")
    probs = np.asarray(probs, np.float64)
    if len(ids) == 0:
        z = np.zeros(0, np.int64)
        return KernelStats(z.astype(np.int32), z, z, z, z, probs, np.zeros((0, len(probs))))
    if ids.min() < 0 or ids.max() >= 1 << 22:
        raise ValueError("kernel name ids must lie in [0, 2**22)")
    key = np.sort(ids << _SHIFT | np.minimum(dur, (1 << _SHIFT) - 1))
    kid = key >> _SHIFT
    d = key & ((1 << _SHIFT) - 1)
    bounds = _group_bounds(kid)
    first, stop = bounds[:-1], bounds[1:]
    count = stop - first
    total = np.add.reduceat(dur[np.argsort(ids, kind="stable")], first) if dur.max() >= 1 << _SHIFT else None
    if total is None:
        total = np.add.reduceat(d, first)
    h = (count - 1)[:, None] * probs[None, :]
    lo = np.floor(h).astype(np.int64)
    frac = h - lo
    i = first[:, None] + lo
    j = np.minimum(i + 1, (stop - 1)[:, None])
    xi, xj = d[i].astype(np.float64), d[j].astype(np.float64)
    quantiles = xi + frac * (xj - xi)
    if stream_ids is None:
        sids, idle = np.zeros(0, np.int32), np.zeros(0, np.int64)
    else:
        sids, idle = stream_idle(start_ns, end_ns, stream_ids)
    return KernelStats(
        ids=kid[first].astype(np.int32),
        count=count.astype(np.int64),
        total_ns=total.astype(np.int64),
        min_ns=d[first],
        max_ns=d[stop - 1],
        probs=probs,
        quantiles_ns=quantiles,
        stream_ids=sids,
        idle_ns=idle,
    )
