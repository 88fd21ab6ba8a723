"""The hang detector's wait-for graph: per process group, who waits in which collective and
who has not entered it, over the live ranks of a :class:`HangState`; and which collective
a suspect keeps its peers waiting in."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._hang_state import HangState

__all__ = ["NONE", "WaitGraph", "behind_in", "figures", "stuck_groups", "wait_graph", "waiting_for_lost"]

NONE = np.iinfo(np.int64).max
"""No sequence number (nobody waits in the group)."""


@dataclass(frozen=True)
class WaitGraph:
    """Per-group wait state of the live ranks (arrays indexed by group id or rank)."""

    low: np.ndarray  # per group: lowest seq a member waits in (NONE: nobody waits)
    waiters: np.ndarray  # per group: members waiting in it
    wait_step: np.ndarray  # per group: the lowest last_step of its waiters (waited longest)
    behind_n: np.ndarray  # per group: live members that have not entered it
    size: np.ndarray  # per group: members seen
    kind: np.ndarray  # per group: kind id of that collective (-1 unknown)
    nbytes: np.ndarray  # per group: its size
    blocked: np.ndarray  # per rank: waiting in some collective
    behind: np.ndarray  # per rank: behind in some group
    r: np.ndarray  # entries: rank
    g: np.ndarray  # entries: group
    is_behind: np.ndarray  # entries: this rank is behind in this group


def wait_graph(st: HangState, live: np.ndarray) -> WaitGraph:
    """The wait-for graph of the ``live`` ranks (a mask over the state's rows)."""
    ng = len(st.groups.names)
    valid = (st.gid >= 0) & live[:, None]
    r = np.nonzero(valid)[0]
    g, ent, fin = st.gid[valid], st.ent[valid], st.fin[valid]
    kind, nb = st.kind[valid], st.nbytes[valid]
    inflight = ent > fin
    low = np.full(ng, NONE, np.int64)
    np.minimum.at(low, g[inflight], fin[inflight] + 1)
    waiting = inflight & (fin + 1 == low[g])
    is_behind = (low[g] != NONE) & (ent < low[g])
    wait_step = np.full(ng, NONE, np.int64)
    np.minimum.at(wait_step, g[waiting], st.last_step[r[waiting]])
    gkind = np.full(ng, -1, np.int64)
    gbytes = np.zeros(ng, np.int64)
    exact = waiting & (ent == low[g])  # its last entered collective is the one waited in
    for sel in (waiting, exact):
        gkind[g[sel]] = kind[sel]
        gbytes[g[sel]] = nb[sel]
    all_g = st.gid[st.gid >= 0]
    blocked = np.zeros(st.n, bool)
    blocked[r[inflight]] = True
    behind = np.zeros(st.n, bool)
    behind[r[is_behind]] = True
    return WaitGraph(
        low,
        np.bincount(g[waiting], minlength=ng),
        wait_step,
        np.bincount(g[is_behind], minlength=ng),
        np.bincount(all_g, minlength=ng),
        gkind,
        gbytes,
        blocked,
        behind,
        r,
        g,
        is_behind,
    )


def figures(gr: WaitGraph, gid: int) -> dict[str, float]:
    """The evidence of the collective group ``gid`` waits in."""
    return {
        "seq": float(gr.low[gid]),
        "nbytes": float(gr.nbytes[gid]),
        "waiting_ranks": float(gr.waiters[gid]),
        "group_size": float(gr.size[gid]),
    }


def _waited_longest(gr: WaitGraph, groups: np.ndarray) -> tuple[int, dict[str, float]]:
    """Of candidate groups, the one waited in longest (its waiters' lowest last step),
    then the one with most waiters; with its figures (-1 and none without candidates)."""
    if not len(groups):
        return -1, {}
    order = np.lexsort((-gr.waiters[groups], gr.wait_step[groups]))
    best = int(groups[order[0]])
    return best, figures(gr, best)


def behind_in(gr: WaitGraph, ranks: np.ndarray) -> tuple[int, dict[str, float]]:
    """The collective the given (live) ranks have not entered while peers wait in it."""
    sel = gr.is_behind & np.isin(gr.r, ranks) if len(gr.r) else np.zeros(0, bool)
    return _waited_longest(gr, np.unique(gr.g[sel]))


def waiting_for_lost(st: HangState, gr: WaitGraph, lost: np.ndarray) -> tuple[int, dict[str, float]]:
    """For lost ranks (stale sequence numbers): the collective live peers wait for them in."""
    rows = np.flatnonzero(lost)
    gids = st.gid[rows]
    low = gr.low[np.maximum(gids, 0)]
    ok = (gids >= 0) & (low != NONE) & (st.ent[rows] <= low)
    return _waited_longest(gr, np.unique(gids[ok]))


def stuck_groups(gr: WaitGraph, limit: int) -> np.ndarray:
    """Groups whose members all entered a collective and none finished (a send/recv
    deadlock, a broken communicator): the ``limit`` smallest."""
    stuck = np.flatnonzero((gr.waiters > 0) & (gr.behind_n == 0))
    return stuck[np.argsort(gr.size[stuck], kind="stable")][:limit]
