"""Robust statistics within groups: median, MAD and z-scores, vectorized over metrics."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["GroupIndex", "group_median_scale", "is_identity"]

MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True, eq=False)
class GroupIndex:
    """Rows sorted by group: ``order`` (sorting permutation), group ``keys``, ``starts`` and
    ``sizes``, and ``inverse`` (group index of every row, in original order)."""

    order: np.ndarray
    keys: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray
    inverse: np.ndarray

    @classmethod
    def of(cls, groups: np.ndarray) -> GroupIndex:
        """Index the rows by their group label (any integer array)."""
        g = np.asarray(groups)
        if len(g) and np.all(g[1:] >= g[:-1]):
            order = np.arange(len(g))
            sorted_g = g
        else:
            order = np.argsort(g, kind="stable")
            sorted_g = g[order]
        bounds = np.flatnonzero(sorted_g[1:] != sorted_g[:-1]) + 1
        starts = np.concatenate(([0], bounds)).astype(np.int64)
        sizes = np.diff(np.concatenate((starts, [len(g)]))).astype(np.int64)
        inv_sorted = np.repeat(np.arange(len(starts)), sizes)
        inverse = np.empty(len(g), np.int64)
        inverse[order] = inv_sorted
        return cls(order, sorted_g[starts] if len(g) else sorted_g, starts, sizes, inverse)

    @property
    def n_groups(self) -> int:
        """Number of groups."""
        return len(self.starts)


def group_median_scale(
    x: np.ndarray,
    gi: GroupIndex,
    *,
    floor_abs: np.ndarray | float = 0.5,
    floor_rel: float = 0.01,
    max_sample: int | None = None,
    presorted: bool = False,
    one_sided: np.ndarray | None = None,
    waits: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-group centre and robust scale of every metric row of ``x`` (shape (m, n)).

    By default the centre is the median and the scale ``1.4826 * MAD``. Rows selected by
    the boolean mask ``one_sided`` are metrics where only a slow minority is expected (a
    rank's own work): their centre and scale come from the group's fast side, the 10th
    and 30th percentiles, so that up to 40 % of a group slowed at once neither drags the
    centre nor inflates the scale (the MAD of such a mix is three times the noise's).
    Scales are floored at ``floor_abs`` (per metric or scalar) and at
    ``floor_rel * |centre|``, so a metric that is constant within a group (GC time 0 on
    every rank) still gives finite z-scores. Rows selected by ``waits`` are waits for
    peers (collective time): in a group of two, where a MAD is half the two values'
    difference and no z-score passes 0.7, their centre is the longer wait (the peer's,
    which a late rank leaves waiting) and their sigma ``SMALL_GROUP_REL`` of it, as for a
    small group's own work. Returns two (m, n_groups) arrays.
    """
    m = x.shape[0]
    g = gi.n_groups
    med = np.empty((m, g))
    xs = x if presorted or is_identity(gi.order) else x[:, gi.order]
    if g and np.all(gi.sizes == gi.sizes[0]):
        size = int(gi.sizes[0])
        cube = xs.reshape(m, g, size)
        if max_sample and size > max_sample:
            cube = cube[:, :, :: -(-size // max_sample)]
        med[:] = np.median(cube, axis=2)
        sig = MAD_TO_SIGMA * np.median(np.abs(cube - med[:, :, None]), axis=2)
        if one_sided is not None and one_sided.any():
            med[one_sided], sig[one_sided] = _fast_side(cube[one_sided], axis=2)
        if waits is not None and size == 2:
            med[waits], sig[waits] = _pair_waits(cube[waits], axis=2)
    else:
        sig = np.empty((m, g))
        for j, (s, k) in enumerate(zip(gi.starts.tolist(), gi.sizes.tolist(), strict=True)):
            block = xs[:, s : s + k]
            med[:, j] = np.median(block, axis=1)
            sig[:, j] = MAD_TO_SIGMA * np.median(np.abs(block - med[:, j, None]), axis=1)
            if one_sided is not None and one_sided.any():
                med[one_sided, j], sig[one_sided, j] = _fast_side(block[one_sided], axis=1)
            if waits is not None and k == 2:
                med[waits, j], sig[waits, j] = _pair_waits(block[waits], axis=1)
    floor = np.maximum(np.broadcast_to(np.asarray(floor_abs, float).reshape(-1, 1), (m, 1)), 0.0)
    scale = np.maximum(np.maximum(sig, floor), floor_rel * np.abs(med))
    return med, scale


_Z10, _Z30 = -1.2815516, -0.5244005  # standard normal quantiles


SMALL_GROUP = 3
"""Groups of at most this many ranks have no spread to speak of: their centre is the
fastest rank and their scale ``SMALL_GROUP_REL`` of it (a relative threshold: with the
default z of 6, a rank 12 % slower than the fastest)."""
SMALL_GROUP_REL = 0.02
FEW = 16
"""Groups of up to this many ranks are looked at for two speeds (:func:`_faster_kind`)."""
SPEED_GAP = 1.5
"""Two speeds: a gap between consecutive values of a group (sorted) this many times."""


def _fast_side(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Centre and sigma from the fast side of ``x`` along ``axis``: of a normal whose 10th
    and 30th percentiles these are (of the faster kind's values in a group of two speeds,
    :func:`_faster_kind`), or the fastest value (sigma ``SMALL_GROUP_REL`` of it) in a
    small group."""
    n = x.shape[axis]
    if n <= SMALL_GROUP:
        low = x.min(axis=axis)
        return low, SMALL_GROUP_REL * np.abs(low)
    p10, p30 = np.percentile(x, (10.0, 30.0), axis=axis)
    sigma = (p30 - p10) / (_Z30 - _Z10)
    centre = p30 - _Z30 * sigma
    if n <= FEW:
        _faster_kind(np.moveaxis(x, axis, -1), centre, sigma)
    return centre, sigma


def _faster_kind(x: np.ndarray, centre: np.ndarray, sigma: np.ndarray) -> None:
    """In a group of ``FEW`` ranks or fewer whose values fall in two kinds a ``SPEED_GAP``
    apart (a slower kind of GPU or host), the fast side is the faster kind's (in place):
    the 30th percentile is one of the group's two or three fastest, so a rank slowed among
    a slower half moved it (six ranks, three of a slower kind: the fourth slowed stood at
    the centre). Only where the slower kind moved the centre by three of the faster kind's
    sigmas: a faster kind of most of the group already is the fast side."""
    rows = x.reshape(-1, x.shape[-1])
    c, s = centre.reshape(-1), sigma.reshape(-1)
    srt = np.sort(rows, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = srt[:, 1:] / srt[:, :-1]
    for i in np.flatnonzero(np.nan_to_num(gap, nan=0.0, posinf=0.0).max(axis=1, initial=0.0) >= SPEED_GAP):
        cut = int(np.argmax(np.nan_to_num(gap[i], nan=0.0, posinf=0.0))) + 1
        if cut < 2:  # one fast rank is no kind
            continue
        fast = srt[i, :cut]
        if cut <= SMALL_GROUP:
            kc, ks = fast[0], SMALL_GROUP_REL * abs(fast[0])
        else:
            lo, hi = np.percentile(fast, (10.0, 30.0))
            ks = (hi - lo) / (_Z30 - _Z10)
            kc = hi - _Z30 * ks
        if kc + 3 * ks < c[i]:  # the slower kind moved the group's centre, else it is as it was
            c[i], s[i] = kc, ks
    centre[...] = c.reshape(centre.shape)
    sigma[...] = s.reshape(sigma.shape)


def _pair_waits(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Centre and sigma of waits in groups of two: the longer wait, ``SMALL_GROUP_REL`` of it."""
    high = x.max(axis=axis)
    return high, SMALL_GROUP_REL * np.abs(high)


def is_identity(order: np.ndarray) -> bool:
    """Whether a permutation leaves the order as it is."""
    return len(order) == 0 or (
        order[0] == 0 and order[-1] == len(order) - 1 and bool(np.all(np.diff(order) == 1))
    )
