"""The noise space's faults: one injected slowdown (:class:`SpaceFault`), its shape, who it
slows, how strong and its factor per step, each drawn at random. :mod:`._space` assembles a
job from them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._faults import COMPUTE_STRAGGLER, Label
from ._layout import Layout

SHAPES = ("step", "ramp", "sawtooth", "every_k", "flapping")
"""Fault shapes: a constant slowdown, a drift up to it, a sawtooth (ramping up and back,
over and over), slow on every k-th step only, on and off at random."""
WHO = ("rank", "host", "hosts", "replica", "stage", "ranks")
"""Who a fault slows: one rank, one host, several hosts of one replica, one data-parallel
replica, one pipeline stage, or several ranks of a small job (up to half of it)."""


@dataclass(frozen=True)
class SpaceFault:
    """One injected slowdown of a job of the space: its ``ranks`` compute ``factor[t]``
    times slower on step ``t`` (1 outside the fault)."""

    shape: str
    who: str
    group: str
    """The smallest group that holds the ranks: ``rank:R``, a host name, ``hosts:A,B``,
    ``dp:D``, ``pp:S`` or ``ranks`` (several ranks of a small job, of no one group)."""
    ranks: tuple[int, ...]
    first_step: int
    last_step: int
    """First and last step it acts on (for a drift: from where it adds 5 %)."""
    magnitude: float
    """The peak factor (a drift's end, a sawtooth's top, the slow steps' factor)."""
    period: int
    """Sawtooth period, the k of every k-th step, a flapping fault's mean on-length (steps)."""
    factor: np.ndarray = field(repr=False, compare=False)
    """Per step of the job, the factor on the culprits' compute."""

    def onset(self, at_least: float = 1.2) -> int | None:
        """The first step the factor reaches ``at_least`` (None: never)."""
        hit = np.flatnonzero(self.factor >= at_least - 1e-12)
        return int(hit[0]) if len(hit) else None

    def label(self) -> Label:
        """The ground truth in the simulator's terms (one label for all its ranks)."""
        return Label(COMPUTE_STRAGGLER, self.first_step, self.last_step, self.who, self.group, self.ranks)


def _who(rng: np.random.Generator, layout: Layout) -> tuple[str, tuple[int, ...], str]:
    """Who a fault slows: (who, ranks, smallest group holding them)."""
    n, c = layout.n_ranks, layout.coords
    small = n < 32
    if small:
        hosts_ok = layout.gpus_per_host >= 2 and layout.n_hosts >= 2
        pick = rng.choice(["rank", "ranks", "host"], p=[0.45, 0.4, 0.15] if hosts_ok else [0.5, 0.5, 0.0])
    else:
        whos = (
            ["rank", "host", "hosts", "replica", "stage"]
            if layout.pp > 1
            else ["rank", "host", "hosts", "replica"]
        )
        p = np.array([0.4, 0.2, 0.15, 0.12, 0.13][: len(whos)])
        pick = rng.choice(whos, p=p / p.sum())
    if pick == "rank":
        r = int(rng.integers(0, n))
        return "rank", (r,), f"rank:{r}"
    if pick == "host":
        h = int(rng.integers(0, layout.n_hosts))
        return "host", layout.ranks_of_host(h), Layout.host_name(h)
    if pick == "ranks":
        k = int(rng.integers(2, n // 2 + 1))
        ranks = tuple(sorted(int(r) for r in rng.choice(n, k, replace=False)))
        return "ranks", ranks, _group_of(layout, ranks)
    if pick == "hosts":
        d = int(rng.integers(0, layout.dp))
        hosts = np.unique(c["host"][c["dp"] == d])
        k = int(rng.integers(2, 5))
        if len(hosts) < k:  # a replica on one host: neighbouring hosts instead
            h0 = int(rng.integers(0, layout.n_hosts - k + 1))
            hosts = np.arange(h0, h0 + k)
        else:
            i = int(rng.integers(0, len(hosts) - k + 1))
            hosts = hosts[i : i + k]
        ranks = tuple(int(r) for r in np.flatnonzero(np.isin(c["host"], hosts)))
        return "hosts", ranks, _group_of(layout, ranks)
    if pick == "replica":
        d = int(rng.integers(0, layout.dp))
        ranks = tuple(int(r) for r in np.flatnonzero(c["dp"] == d))
        return "replica", ranks, _group_of(layout, ranks)
    s = int(rng.integers(0, layout.pp))
    ranks = tuple(int(r) for r in np.flatnonzero(c["pp"] == s))
    return "stage", ranks, _group_of(layout, ranks)


def _group_of(layout: Layout, ranks: tuple[int, ...]) -> str:
    """The smallest group holding ``ranks``: one rank, one host, one replica or stage
    (exactly), several whole hosts, else ``ranks``."""
    c = layout.coords
    sel = np.asarray(ranks)
    if len(sel) == 1:
        return f"rank:{ranks[0]}"
    hosts = np.unique(c["host"][sel])
    if len(hosts) == 1:
        return Layout.host_name(int(hosts[0]))
    for col in ("dp", "pp"):
        vals = np.unique(c[col][sel])
        if len(vals) == 1 and np.count_nonzero(c[col] == vals[0]) == len(sel) and getattr(layout, col) > 1:
            return f"{col}:{int(vals[0])}"
    if np.count_nonzero(np.isin(c["host"], hosts)) == len(sel):
        return "hosts:" + ",".join(Layout.host_name(int(h)) for h in hosts)
    return "ranks"


def _magnitude(rng: np.random.Generator, shape: str, who: str) -> float:
    if shape == "every_k":
        return float(rng.uniform(1.5, 4.0))
    if who != "rank":
        return float(rng.uniform(1.05, 1.4))
    u = rng.random()
    if u < 0.15:
        return float(rng.uniform(1.05, 1.1))
    if u < 0.4:
        return float(rng.uniform(1.1, 1.2))
    if u < 0.8:
        return float(rng.uniform(1.2, 1.5))
    return float(rng.uniform(1.5, 2.5))


def _fault_factor(
    rng: np.random.Generator, shape: str, steps: int, first: int, length: int, m: float
) -> tuple[np.ndarray, int]:
    """Per step of the job, the fault's factor; and its period parameter."""
    f = np.ones(steps)
    i = np.arange(length, dtype=float)
    period = 0
    if shape == "step":
        f[first : first + length] = m
    elif shape == "ramp":
        f[first : first + length] = 1.0 + (m - 1.0) * (i + 1) / length
    elif shape == "sawtooth":  # up to m and back down, over and over
        period = int(rng.integers(8, max(9, min(80, length // 3))))
        phase = (i % period) / period
        f[first : first + length] = 1.0 + (m - 1.0) * (1.0 - np.abs(2.0 * phase - 1.0))
    elif shape == "every_k":
        period = int(rng.integers(2, 11))
        f[first : first + length] = np.where(i % period == 0, m, 1.0)
    else:  # flapping: on and off at random, each stretch a few to tens of steps
        period = int(rng.integers(4, 31))
        on, t = True, 0
        seg = np.ones(length, bool)
        while t < length:
            run = int(rng.geometric(1.0 / period))
            seg[t : t + run] = on
            t += run
            on = not on
        seg[-1] = True  # the fault's window ends on a slow step
        f[first : first + length] = np.where(seg, m, 1.0)
    return f, period
