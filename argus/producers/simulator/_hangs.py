"""Hang scenarios: the heartbeats of a job that stops, with the ground truth.

A job of ``layout`` makes one step every ``step_s`` seconds; every rank sends a heartbeat
every ``heartbeat_s`` (each rank at its own phase). At ``at_s`` the scenario strikes in
step ``h`` and the heartbeats freeze in the state a real job would freeze in (Megatron
order: per step 4 tensor-parallel collectives ``tp:<pp>.<dp>``, 2 send/recv per adjacent
stage pair ``p2p:<dp>.<tp>:<s>-<s+1>`` and one data-parallel all-reduce
``dp:<pp>.<tp>``; every peer blocks where it must wait for the culprit, directly or
through others):

* ``collective_hang``: one rank never enters step ``h``'s data-parallel all-reduce (it is
  stuck in a CUDA sync, in data loading or in a Python lock);
* ``process_death``: the same rank's process dies there (its heartbeats stop);
* ``host_silent``: a whole host stops (its ranks' heartbeats stop);
* ``p2p_deadlock``: two adjacent pipeline stages both ``send`` to each other and wait;
* ``declared_checkpoint``: every rank writes a checkpoint for ``pause_s`` seconds and
  declared it (heartbeat ``pause``): not a hang, no label.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from argus.schemas import Heartbeat

from ._layout import Layout
from ._stacks import STACKS

__all__ = ["HANG_LOST", "HANG_SCENARIOS", "HangLabel", "HangScenario", "HangSimulator"]

HANG = "hang"
LOST_RANK = "lost_rank"
HANG_SCENARIOS: tuple[str, ...] = (
    "collective_hang",
    "process_death",
    "host_silent",
    "p2p_deadlock",
    "declared_checkpoint",
)
HANG_LOST = {
    "collective_hang": HANG,
    "process_death": LOST_RANK,
    "host_silent": LOST_RANK,
    "p2p_deadlock": HANG,
}
"""The detector class each hang scenario must be named with (the checkpoint has none)."""

_ROOT = "train.py:<module>;train.py:main;train.py:train_step"
STUCK_STACKS = (
    STACKS["hidden"],  # a CUDA sync
    STACKS["dataloader_ms"],
    f"{_ROOT};train.py:log_metrics;logging/__init__.py:handle;threading.py:acquire",
)
_P2P = f"{_ROOT};megatron/core/pipeline_parallel/p2p_communication.py:_communicate;torch/distributed/distributed_c10d.py:send"
_KINDS = ("all_gather", "all_reduce", "recv", "send")
_TP, _TP_BYTES, _DP_BYTES, _P2P_BYTES = 4, 64 << 20, 512 << 20, 16 << 20


@dataclass(frozen=True)
class HangScenario:
    """One hang: ``kind`` (of :data:`HANG_SCENARIOS`) at ``at_s`` seconds into the job.

    ``rank`` is the culprit (``collective_hang``, ``process_death``; the lower stage of
    the pair for ``p2p_deadlock``), ``host`` the silent host index; None picks one from the
    seed. ``pause_s`` is the declared checkpoint's length.
    """

    kind: str
    at_s: float = 40.0
    rank: int | None = None
    host: int | None = None
    pause_s: float = 90.0

    def __post_init__(self) -> None:
        if self.kind not in HANG_SCENARIOS:
            raise ValueError(f"unknown hang scenario {self.kind!r}")


@dataclass(frozen=True)
class HangLabel:
    """Ground truth: the class, the suspect as the detector names it, the collective."""

    scenario: str
    cause: str
    suspect_kind: str
    suspect: str
    ranks: tuple[int, ...]
    group: str
    collective: str
    start_ns: int


class HangSimulator:
    """Heartbeats of a job of ``layout`` that hangs as ``scenario`` says (deterministic).

    Args:
        layout: the parallel layout.
        scenario: the hang.
        seed: picks the culprit (when not given) and the heartbeat phases.
        step_s: the job's step time; heartbeat_s: every rank's heartbeat period.
    """

    def __init__(
        self,
        layout: Layout,
        scenario: HangScenario,
        *,
        seed: int = 0,
        job: str = "sim-hang",
        run: int = 0,
        step_s: float = 0.5,
        heartbeat_s: float = 5.0,
        start_ns: int = 1_767_225_600 * 10**9,
    ) -> None:
        self.layout, self.scenario, self.job, self.run_id = layout, scenario, job, run
        self.step_s, self.heartbeat_s, self.start_ns = step_s, heartbeat_s, start_ns
        rng = np.random.default_rng([seed, 7_000_001])
        n = layout.n_ranks
        self.phase_ns = (rng.random(n) * heartbeat_s * 1e9).astype(np.int64)
        c = layout.coords
        self.c = c
        if scenario.kind == "p2p_deadlock" and layout.pp < 2:
            raise ValueError("a pipeline deadlock needs pp >= 2")
        rank = scenario.rank
        if rank is None:
            if scenario.kind == "p2p_deadlock":
                rank = layout.rank_at(
                    pp=int(rng.integers(0, layout.pp - 1)),
                    dp=int(rng.integers(0, layout.dp)),
                    tp=int(rng.integers(0, layout.tp)),
                )
            else:
                rank = int(rng.integers(0, n))
        self.culprit = rank
        self.host = scenario.host if scenario.host is not None else layout.host_of(rank)
        self.stuck_stack = STUCK_STACKS[int(rng.integers(0, len(STUCK_STACKS)))]
        self.hang_ns = start_ns + int(scenario.at_s * 1e9)
        self.hang_step = int(scenario.at_s // step_s)
        hosts = np.array([Layout.host_name(h) for h in range(layout.n_hosts)], dtype=object)
        self.hosts = hosts[c["host"]]
        self._names = self._group_names()
        self._slot_ids = self._slots()
        self._hostnames = [str(h) for h in self.hosts.tolist()]
        self._frozen = self._freeze()
        self._tables()

    # -- groups ------------------------------------------------------------------------
    def _group_names(self) -> list[np.ndarray]:
        lay, c = self.layout, self.c
        pp, dp, tp = (c[k].astype(str).astype(object) for k in ("pp", "dp", "tp"))
        lo_s, hi_s = (c["pp"] - 1).astype(str).astype(object), (c["pp"] + 1).astype(str).astype(object)
        names = [
            "tp:" + pp + "." + dp if lay.tp > 1 else None,
            "dp:" + pp + "." + tp if lay.dp > 1 else None,
            np.where(c["pp"] > 0, "p2p:" + dp + "." + tp + ":" + lo_s + "-" + pp, "") if lay.pp > 1 else None,
            np.where(c["pp"] < lay.pp - 1, "p2p:" + dp + "." + tp + ":" + pp + "-" + hi_s, "")
            if lay.pp > 1
            else None,
        ]
        return [x for x in names if x is not None]

    def _slots(self) -> list[int]:
        lay = self.layout
        return [i for i, on in enumerate((lay.tp > 1, lay.dp > 1, lay.pp > 1, lay.pp > 1)) if on]

    def _healthy(self, steps: int) -> dict[str, np.ndarray]:
        """Per rank and slot (tp, dp, lo pair, hi pair): entered, finished, kind, stack."""
        n = self.layout.n_ranks
        base = np.array([_TP * steps, steps, 2 * steps, 2 * steps], np.int64)
        ent = np.tile(base, (n, 1))
        kind = np.tile(np.array(_KINDS, dtype=object), (n, 1))
        return {
            "ent": ent,
            "fin": ent.copy(),
            "kind": kind,
            "stack": np.full(n, STACKS["forward_ms"], object),
            "last": np.full(n, self.hang_step - 1, np.int64),
        }

    def _freeze(self) -> dict[str, np.ndarray]:
        """The state every rank freezes in after the hang (see the module docstring)."""
        lay, c, h, kind = self.layout, self.c, self.hang_step, self.scenario.kind
        st = self._healthy(h + 1)
        ent, fin, knd, stack = st["ent"], st["fin"], st["kind"], st["stack"]
        if kind == "declared_checkpoint":
            st = self._healthy(h)
            st["stack"][:] = STACKS["checkpoint_ms"]
            return st
        pp, dp, tp = c["pp"], c["dp"], c["tp"]
        if kind == "p2p_deadlock":
            st = self._healthy(h)
            ent, fin, knd, stack = st["ent"], st["fin"], st["kind"], st["stack"]
            a = self.culprit
            s, d, t = int(pp[a]), int(dp[a]), int(tp[a])
            rep = dp == d
            other = ~rep
            ent[other] = [_TP * (h + 1), h + 1, 2 * (h + 1), 2 * (h + 1)]
            fin[other] = [_TP * (h + 1), h, 2 * (h + 1), 2 * (h + 1)]
            knd[other, 1] = "all_reduce"
            stack[other] = STACKS["collective"]
            below, above = rep & (pp < s), rep & (pp > s + 1)
            ent[below, 3], fin[below, 3] = 2 * h + 2, 2 * h + 1  # waiting for the gradient
            knd[below, 3] = "recv"
            ent[below, 0] = fin[below, 0] = _TP * h + 2
            ent[below, 2] = fin[below, 2] = 2 * h + 1
            ent[above, 2], fin[above, 2] = 2 * h + 1, 2 * h  # waiting for activations
            knd[above, 2] = "recv"
            stack[below | above] = _P2P
            mid = rep & ((pp == s) | (pp == s + 1))
            peers = mid & (tp != t)
            ent[peers, 0], fin[peers, 0] = _TP * h + 1, _TP * h  # TP waits for the pair
            ent[peers & (pp == s), 3] = fin[peers & (pp == s), 3] = 2 * h + 1
            ent[peers & (pp == s + 1), 2] = fin[peers & (pp == s + 1), 2] = 2 * h + 1
            ent[mid & (pp == s) & (pp > 0), 2] = fin[mid & (pp == s) & (pp > 0), 2] = 2 * h + 1
            stack[peers] = STACKS["collective"]
            b = lay.rank_at(pp=s + 1, dp=d, tp=t)
            ent[a, 3], fin[a, 3], knd[a, 3] = 2 * h + 1, 2 * h, "send"
            ent[b, 2], fin[b, 2], knd[b, 2] = 2 * h + 1, 2 * h, "send"
            stack[[a, b]] = _P2P
            return st
        stuck = self.stuck_ranks()
        star = int(pp[stuck[0]])
        u = np.zeros(lay.n_ranks, bool)
        u[stuck] = True
        blocked = (pp == star) & np.isin(tp, tp[stuck]) & ~u  # wait in the all-reduce for U
        free = ~u & ~blocked
        ent[u | blocked, 1], fin[u | blocked, 1] = h, h
        ent[blocked, 1] = h + 1
        stack[blocked] = STACKS["collective"]
        stack[u] = self.stuck_stack
        # the free ranks go on into step h + 1 and block on the stuck stage
        nxt = 2 * (h + 1)
        low = free & (pp < star - 1)
        ent[low, 0] = fin[low, 0] = _TP * (h + 1) + 2
        ent[low, 3], fin[low, 3], knd[low, 3] = nxt + 2, nxt + 1, "recv"
        ent[low & (pp > 0), 2] = fin[low & (pp > 0), 2] = nxt + 1
        edge = free & (pp == star - 1)
        ent[edge, 0] = fin[edge, 0] = _TP * (h + 1) + 2
        ent[edge & (pp > 0), 2] = fin[edge & (pp > 0), 2] = nxt + 1
        upper_blocked = ~free[np.clip(self._rank_shift(1), 0, lay.n_ranks - 1)]
        ent[edge, 3] = np.where(upper_blocked[edge], nxt + 1, nxt + 2)
        fin[edge, 3] = np.where(upper_blocked[edge], nxt, nxt + 1)
        knd[edge, 3] = np.where(upper_blocked[edge], "send", "recv")
        same = free & (pp == star)
        ent[same, 0], fin[same, 0] = _TP * (h + 1) + 1, _TP * (h + 1)
        ent[same & (pp > 0), 2] = fin[same & (pp > 0), 2] = nxt + 1
        up = free & (pp > star)
        ent[up, 2], fin[up, 2], knd[up, 2] = nxt + 1, nxt, "recv"
        stack[free] = np.where(same[free], STACKS["collective"], _P2P)
        st["last"][free] = h  # they finished step h (its all-reduce) and went on
        return st

    def _rank_shift(self, stages: int) -> np.ndarray:
        """Per rank: the rank ``stages`` pipeline stages up (same dp, tp)."""
        lay = self.layout
        return self.c["rank"] + stages * lay.dp * lay.cp * lay.tp

    def stuck_ranks(self) -> np.ndarray:
        """The ranks that stop (the culprit, or every rank of the silent host)."""
        if self.scenario.kind == "host_silent":
            return np.array(self.layout.ranks_of_host(self.host), np.int64)
        return np.array([self.culprit], np.int64)

    # -- ground truth ------------------------------------------------------------------
    @property
    def labels(self) -> tuple[HangLabel, ...]:
        """What the detector must say (none for a declared checkpoint)."""
        k, lay = self.scenario.kind, self.layout
        c, r = self.c, self.culprit
        dp_group = f"dp:{c['pp'][r]}.{c['tp'][r]}"
        if k == "collective_hang":
            return (HangLabel(k, HANG, "rank", f"rank:{r}", (r,), dp_group, "all_reduce", self.hang_ns),)
        if k == "process_death":
            return (HangLabel(k, LOST_RANK, "rank", f"rank:{r}", (r,), dp_group, "all_reduce", self.hang_ns),)
        if k == "host_silent":
            ranks = lay.ranks_of_host(self.host)
            name = Layout.host_name(self.host)
            return (HangLabel(k, LOST_RANK, "host", name, ranks, "", "all_reduce", self.hang_ns),)
        if k == "p2p_deadlock":
            s, d, t = int(c["pp"][r]), int(c["dp"][r]), int(c["tp"][r])
            group = f"p2p:{d}.{t}:{s}-{s + 1}"
            b = lay.rank_at(pp=s + 1, dp=d, tp=t)
            return (HangLabel(k, HANG, "group", group, (r, b), group, "send", self.hang_ns),)
        return ()

    # -- heartbeats --------------------------------------------------------------------
    def _silent(self) -> np.ndarray:
        out = np.zeros(self.layout.n_ranks, bool)
        if self.scenario.kind in ("process_death", "host_silent"):
            out[self.stuck_ranks()] = True
        return out

    def beats(self, t0_ns: int, t1_ns: int) -> list[Heartbeat]:
        """Heartbeats sent in ``[t0_ns, t1_ns)``, in time order."""
        period = int(self.heartbeat_s * 1e9)
        out: list[tuple[int, int]] = []
        first = self.start_ns + self.phase_ns
        k0 = np.maximum(0, -(-(t0_ns - first) // period))
        silent = self._silent()
        for k in range(int(k0.min()), int(np.max((t1_ns - first) // period)) + 1):
            t = first + k * period
            sel = np.flatnonzero((t >= t0_ns) & (t < t1_ns) & (t >= first) & ~(silent & (t >= self.hang_ns)))
            out.extend(zip(t[sel].tolist(), sel.tolist(), strict=True))
        out.sort()
        return [self._beat(r, t) for t, r in out]

    def _tables(self) -> None:
        """Per rank, as Python tuples: groups, sizes, slots, the frozen state."""
        size = (_TP_BYTES, _DP_BYTES, _P2P_BYTES, _P2P_BYTES)
        names = [x.tolist() for x in self._names]
        f = self._frozen
        ent, fin, kinds = f["ent"].tolist(), f["fin"].tolist(), f["kind"].tolist()
        self._slotj: list[tuple[int, ...]] = []
        self._groups: list[tuple[str, ...]] = []
        self._sizes: list[tuple[int, ...]] = []
        self._fz: list[tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]] = []
        for r in range(self.layout.n_ranks):
            slots = [(j, col[r]) for j, col in zip(self._slot_ids, names, strict=True) if col[r]]
            js = tuple(j for j, _ in slots)
            self._slotj.append(js)
            self._groups.append(tuple(str(g) for _, g in slots))
            self._sizes.append(tuple(size[j] for j in js))
            e, fi, k = ent[r], fin[r], kinds[r]
            self._fz.append((tuple(e[j] for j in js), tuple(fi[j] for j in js), tuple(k[j] for j in js)))
        self._stacks = [str(x) for x in f["stack"].tolist()]
        self._last = f["last"].tolist()

    def _beat(self, rank: int, t: int) -> Heartbeat:
        sc = self.scenario
        pause, until = "", 0
        end_pause = self.hang_ns + int(sc.pause_s * 1e9)
        js = self._slotj[rank]
        if t < self.hang_ns or (sc.kind == "declared_checkpoint" and t >= end_pause):
            shift = sc.pause_s if t >= self.hang_ns else 0.0
            steps = int((t - self.start_ns) / 1e9 / self.step_s - shift / self.step_s)
            per = (_TP * steps, steps, 2 * steps, 2 * steps)
            ent = fin = tuple(per[j] for j in js)
            kinds = tuple(_KINDS[j] for j in js)
            stack, last = STACKS["forward_ms"], steps - 1
        else:
            ent, fin, kinds = self._fz[rank]
            stack, last = self._stacks[rank], self._last[rank]
            if sc.kind == "declared_checkpoint":
                pause, until = "checkpoint", end_pause
        return Heartbeat(
            self.job,
            self.run_id,
            rank,
            self._hostnames[rank],
            t,
            last,
            self._groups[rank],
            ent,
            fin,
            kinds,
            self._sizes[rank],
            stack,
            pause,
            until,
        )

    def ticks(
        self, tick_s: float, until_s: float, from_s: float = 0.0
    ) -> Iterator[tuple[int, list[Heartbeat]]]:
        """``(now_ns, heartbeats sent since the last tick)`` every ``tick_s`` from ``from_s`` to ``until_s``."""
        step = int(tick_s * 1e9)
        t = self.start_ns + int(from_s * 1e9)
        end = self.start_ns + int(until_s * 1e9)
        while t < end:
            yield t + step, self.beats(t, t + step)
            t += step
