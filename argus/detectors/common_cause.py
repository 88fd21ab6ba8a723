"""One finding per common cause: open change points (:mod:`detectors.changepoint`) that
started together with a similar size are one suspect.

Ranks whose changes opened within ``cp_onset_within`` steps of the first of them (or within
their onsets' spread, :meth:`detectors.changepoint.ChangeState.began`: a weak change's onset is
known to tens of steps), with sizes within a factor ``cp_size_ratio`` of that first one's,
are one cause, named by the
smallest group of the layout that holds them: one rank, its host, its data-parallel
replica, its group (pp stage), the hosts (a few), else the ranks themselves (a log without
a host column: ``ranks:8-15``). Its cause is the own-work phase that rose (compute: a
compute straggler; time outside every timer: a masked one, or ``unknown`` in a log that
has nothing else).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from argus.schemas.causes import (
    COMPUTE_STRAGGLER,
    DATALOADER_STALL,
    GC_PAUSE,
    JIT_COMPILE_STALL,
    MASKED_COMPUTE_STRAGGLER,
    UNKNOWN,
)

from ._config import DiagnoserConfig
from ._finding import Finding
from .changepoint import ChangeState, RankResiduals, building
from .cross_rank import OWN_WORK

__all__ = [
    "CHANGE_FIGURE",
    "ONSET_SPREAD",
    "OPENED",
    "began_together",
    "cause_findings",
    "named_hosts",
    "ranks_label",
    "smallest_group",
]

CHANGE_FIGURE = "change_size"
"""The deciding figure of a change-point finding: the shift of the ranks' residual (log
ratio of their own work to their peers', against their own baseline)."""
_BY_PHASE = {
    "compute_ms": COMPUTE_STRAGGLER,
    "dataloader_ms": DATALOADER_STALL,
    "h2d_ms": DATALOADER_STALL,
    "gc_ms": GC_PAUSE,
    "compile_ms": JIT_COMPILE_STALL,
    "unaccounted_ms": MASKED_COMPUTE_STRAGGLER,
}
ONSET_SPREAD = "change_onset_spread"
"""Evidence of a change-point finding: the steps within which its onset is known (the
median of its ranks' :meth:`detectors.changepoint.ChangeState.began`)."""
OPENED = "change_opened"
"""Evidence of a change-point finding: the step its ranks' changes opened in (their median;
-1 for slow every k-th step)."""
_MAX_HOSTS_NAMED = 8
_STAGE_SHARE = 0.5
"""Share of a group's (pp stage's) ranks with a change open from which the changes are the
stage's: a stage slower than the others is the stage imbalance rule's, not its ranks'."""
_WHOLE = 0.8
"""Share of a group's ranks that makes a change the group's own (a stage imbalance)."""


def ranks_label(ranks: list[int]) -> str:
    """Ranks as runs: ``8-15,24``."""
    out: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
        if r is not None:
            start = prev = r
    return ",".join(out)


def began_together(
    cfg: DiagnoserConfig,
    onset_a: Any,
    spread_a: Any,
    opened_a: Any,
    onset_b: Any,
    spread_b: Any,
    opened_b: Any,
) -> Any:
    """Whether changes (scalars, or arrays that broadcast) began together, as one cause's
    do: their onsets within ``cp_onset_within`` steps, or the wider of their onsets'
    spreads (:meth:`detectors.changepoint.ChangeState.began`, at most ``cp_onset_within_max``);
    or found together, both more than ``cp_onset_within`` steps after their onsets, ``opened``
    within ``cp_onset_within`` steps of each other (-1: not known), each one's onset before
    the other opened: a ramp's ranks each cross the test's reference at a step of their own,
    15 windows apart among three workers, and are found in the same few."""
    cap = max(cfg.cp_onset_within, cfg.cp_onset_within_max)
    within = np.clip(np.maximum(spread_a, spread_b), cfg.cp_onset_within, cap)
    near = np.abs(np.subtract(onset_a, onset_b)) <= within
    # (both long in the finding: a change found a few steps after its onset is dated by
    # it, and a rank's flapping 1.23x joined a host's fault whose change reopened beside it)
    slow = np.minimum(np.subtract(opened_a, onset_a), np.subtract(opened_b, onset_b)) > cfg.cp_onset_within
    found = (
        (np.minimum(opened_a, opened_b) >= 0)
        & slow
        & (np.abs(np.subtract(opened_a, opened_b)) <= cfg.cp_onset_within)
        & (np.less_equal(onset_a, opened_b))
        & (np.less_equal(onset_b, opened_a))
    )
    return near | found


def _clusters(
    onset: np.ndarray,
    size: np.ndarray,
    period: np.ndarray,
    spread: np.ndarray,
    opened: np.ndarray,
    cfg: DiagnoserConfig,
) -> list[np.ndarray]:
    """Indexes of changes that are one cause, in order of their first onset: the connected
    sets of changes linked pairwise as begun together (:func:`began_together`, from their
    onsets, their ``spread`` and the steps they ``opened`` in: ranks of one fault seen every
    few seconds open a step or two apart, a weak one's tens of steps apart), sizes within
    ``cp_size_ratio``, and one shape: a sustained shift (``period`` 0) or slow every k-th step
    within a step of its k (a rank slow every sixth step and a host's ramp crossing its
    thresholds in the same steps were one suspect). Connected, not first come: a cause seen
    whole holds every part of it seen before (as each step's first-come clusters were
    formed, a replica 1.07x split anew as its ranks opened, 8 to 10 anomalies)."""
    if not len(onset):
        return []
    a = np.abs(size)
    lo, hi = np.minimum(a[:, None], a[None, :]), np.maximum(a[:, None], a[None, :])
    shift = period == 0
    shape = (shift[:, None] == shift[None, :]) & (np.abs(period[:, None] - period[None, :]) <= 1)
    together = began_together(
        cfg,
        onset[:, None],
        spread[:, None],
        opened[:, None],
        onset[None, :],
        spread[None, :],
        opened[None, :],
    )
    link = together & shape & (hi <= cfg.cp_size_ratio * np.maximum(lo, 1e-9))
    _, label = connected_components(csr_matrix(link), directed=False)
    order = np.lexsort((-size, onset))
    firsts: dict[int, list[int]] = {}
    for i in order.tolist():
        firsts.setdefault(int(label[i]), []).append(i)
    return [np.array(m) for m in firsts.values()]


def _where(ranks: np.ndarray, rows: np.ndarray, res: RankResiduals, group_column: str) -> tuple[str, str]:
    """(suspect kind, suspect) of the smallest group holding ``ranks`` (their batch rows)."""
    if len(ranks) == 1:
        return "rank", f"rank:{int(ranks[0])}"
    hosts = {str(h) for h in res.hosts[rows]}
    named = not any(h == f"rank-{int(r)}" for h, r in zip(res.hosts[rows], ranks, strict=True))
    if named and len(hosts) == 1:
        return "host", hosts.pop()
    # (the fewest ranks of the step: four hosts of a stage of 512 ranks are the hosts, not
    # the stage; hosts only where the ranks are at least half of theirs: three ranks of
    # three hosts in a slowed stage are the stage's, and gpu0 of two hosts whose other
    # GPUs are fine is those two ranks, not the hosts)
    held: list[tuple[bool, int, int, str]] = []  # (a few ranks of hosts, ranks held, order, name)
    dp = np.unique(res.dp[rows])
    if len(dp) == 1 and res.replicas:
        held.append((False, int(np.count_nonzero(res.dp == dp[0])), 0, f"dp:{int(dp[0])}"))
    grp = np.unique(res.group[rows])
    if len(grp) == 1 and len(np.unique(res.group)) > 1:
        held.append((False, int(np.count_nonzero(res.group == grp[0])), 1, f"{group_column}:{int(grp[0])}"))
    if named and len(hosts) <= _MAX_HOSTS_NAMED:
        on_hosts = int(np.isin(res.hosts, sorted(hosts)).sum())
        held.append((2 * len(ranks) < on_hosts, on_hosts, 2, "hosts:" + ",".join(sorted(hosts))))
    if held and not (best := min(held))[0]:
        return "ranks", best[3]
    return "ranks", "ranks:" + ranks_label(sorted(int(r) for r in ranks))


def named_hosts(ranks: Sequence[int], res: RankResiduals) -> set[str]:
    """The hosts of those of ``ranks`` in this step that name one (not ``rank-N``)."""
    rows = np.flatnonzero(np.isin(res.ranks, ranks))
    return {str(h) for h, r in zip(res.hosts[rows], res.ranks[rows], strict=True) if h != f"rank-{int(r)}"}


def smallest_group(ranks: list[int], res: RankResiduals, group_column: str) -> tuple[str, str] | None:
    """(suspect kind, suspect) of the smallest group of the layout that holds the ``ranks``
    this batch holds, as a change finding is named (a host, a replica, a group, the hosts,
    else ``ranks:…``); None where fewer than two of them are in it."""
    pos = {int(r): j for j, r in enumerate(res.ranks.tolist())}
    here = [r for r in ranks if r in pos]
    if len(here) < 2:
        return None
    return _where(np.asarray(here), np.array([pos[r] for r in here]), res, group_column)


def cause_findings(st: ChangeState, res: RankResiduals, cfg: DiagnoserConfig) -> list[Finding]:
    """One finding per common cause among the ranks of this step with a change open (in a
    log of step times only, time outside the timers is the whole step: ``unknown``)."""
    open_ranks = st.open_ranks()
    if not len(open_ranks):
        return []
    row_of = {int(r): j for j, r in enumerate(res.ranks.tolist())}
    present = [r for r in open_ranks.tolist() if r in row_of]
    if not present:
        return []
    ranks = np.array(present)
    rows = np.array([row_of[r] for r in present])
    keys, sizes = np.unique(res.group, return_counts=True)
    if len(keys) > 1:
        # against its replica only, nothing building against its group's peers: its group
        # (pp stage) moved, the stage's finding (a stage ramping to 1.3x crossed the line
        # rank by rank: seven anomalies)
        alone = (st.onset[1, ranks] >= 0) & (st.onset[0, ranks] < 0)
        if alone.any():
            own = ~alone | building(st, cfg)[0, ranks]
            ranks, rows = ranks[own], rows[own]
            if not len(ranks):
                return []
        # half a stage or more changed at once: the stage's finding (the layout's)
        at = np.searchsorted(keys, res.group[rows])
        share = np.bincount(at, minlength=len(keys)) / sizes
        keep = share[at] < _STAGE_SHARE
        ranks, rows = ranks[keep], rows[keep]
        if not len(ranks):
            return []
    per = st.period[:, ranks]
    # slow every k-th step first (its clipped spikes open a change too: its rhythm is the
    # finer word), else a sustained shift; a rhythm's size is its mean excess per step
    shift = (st.onset[:, ranks] >= 0).any(axis=0) & (per[0] < 0)
    on = np.where(
        shift,
        np.where(st.onset[:, ranks] >= 0, st.onset[:, ranks], np.iinfo(np.int64).max).min(axis=0),
        per[0],
    )
    size = np.where(
        shift,
        np.where(st.onset[:, ranks] >= 0, st.size[:, ranks], -np.inf).max(axis=0),
        st.spike_size[ranks] / np.maximum(per[1], 1),
    )
    # what it adds on a step it is slow in: every step of a shift, a periodic rank's spikes
    slow = np.where(shift, size, st.spike_size[ranks])
    sig = np.where(st.onset[:, ranks] >= 0, st.sig[:, ranks], np.inf).min(axis=0)
    sig = np.where(shift, sig, st.sig[0, ranks])
    period = np.where(shift, 0, per[1])
    spread, opened = st.began(ranks)
    spread, opened = np.where(shift, spread, 0), np.where(shift, opened, -1)
    # a change whose closing sum is building (back below half its size) is no sighting
    back: np.ndarray = np.asarray((np.where(st.onset[:, ranks] >= 0, st.t[:, ranks], np.inf) > 0).all(axis=0))
    back = np.where(shift, back, per[2] != st.seen[0, ranks])  # periodic: sighted on its spikes
    out = []
    for c in _clusters(on, size, period, spread, opened, cfg):
        if back[c].all():
            continue
        members, mrows = ranks[c], rows[c]
        kind, suspect = _where(members, mrows, res, cfg.group_column)
        if suspect.startswith(f"{cfg.group_column}:") and len(c) >= _WHOLE * np.sum(
            res.group == res.group[mrows[0]]
        ):
            continue  # a whole stage slower than the others: the stage's finding (the layout's)
        phase = Counter(OWN_WORK[int(p)] for p in st.phase[members]).most_common(1)[0][0]
        cause = _BY_PHASE.get(phase, COMPUTE_STRAGGLER)
        if phase == "unaccounted_ms" and res.untimed:
            cause = UNKNOWN
        sz = float(np.median(slow[c]))
        added = float(np.expm1(max(sz, 0.0)) * res.work_ms)
        ev = {
            CHANGE_FIGURE: round(float(np.expm1(sz)), 4),
            "change_onset": float(np.median(on[c]).round()),
            "change_ranks": float(len(c)),
            "change_sigmas": round(float(np.median(size[c] / np.maximum(sig[c], 1e-9))), 4),
            ONSET_SPREAD: round(min(float(np.median(spread[c])), float(cfg.cp_onset_within_max)), 1),
            OPENED: float(np.median(opened[c]).round()),
            "step_ms": round(res.work_ms, 4),
        }
        k = int(np.median(period[c]))
        if k:
            ev["period_steps"] = float(k)
        order = np.argsort(members)
        out.append(
            Finding(
                cause,
                "cross_rank",
                kind,
                suspect,
                tuple(int(r) for r in members[order][: cfg.max_listed]),
                float(ev["change_sigmas"]),
                CHANGE_FIGURE,
                ev,
                added,
            )
        )
    return out
