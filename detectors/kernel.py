"""Kernel level, only for suspects: a rank's kernel statistics against the cross-rank
consensus of its peers (and optionally its own history), as a distribution distance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from argus.schemas import KernelStats

__all__ = ["KernelFinding", "kernel_level"]


@dataclass(frozen=True)
class KernelFinding:
    """How one rank's kernels differ from its peers'.

    ``distance``: time-weighted mean |log| ratio of the rank's duration quantiles to the
    peers' consensus (element-wise median); ``compute_ratio``/``collective_ratio``:
    time-weighted geometric mean per-call duration ratio of compute / NCCL kernels;
    ``idle_ratio``: the rank's GPU idle time over the peers' median; ``degraded``: kernels
    whose median duration ratio reaches the threshold, worst first; ``history_distance``:
    the same distance against the rank's own earlier statistics (nan without history).
    """

    rank: int
    distance: float
    compute_ratio: float
    collective_ratio: float
    idle_ratio: float
    degraded: tuple[tuple[str, float], ...]
    history_distance: float = float("nan")

    def evidence(self) -> dict[str, float]:
        """The figures as Anomaly evidence entries."""
        ev = {
            "kernel_distance": round(self.distance, 4),
            "kernel_compute_ratio": round(self.compute_ratio, 4),
            "kernel_collective_ratio": round(self.collective_ratio, 4),
            "kernel_idle_ratio": round(self.idle_ratio, 4),
        }
        if np.isfinite(self.history_distance):
            ev["kernel_history_distance"] = round(self.history_distance, 4)
        for name, ratio in self.degraded[:2]:
            ev[f"kernel:{name[:120]}"] = round(ratio, 4)
        return ev


def _name(names: Mapping[int, str] | Sequence[str] | None, kid: int) -> str:
    if names is None:
        return str(kid)
    try:
        return str(names[kid])
    except (KeyError, IndexError):
        return str(kid)


def _log_ratios(s: KernelStats, refs: Sequence[KernelStats]) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel of ``s``: log ratio of its quantiles to the refs' median (nan if absent)."""
    k, q = s.quantiles_ns.shape
    stack = np.full((len(refs), k, q), np.nan)
    for p, ref in enumerate(refs):
        pos = {int(i): j for j, i in enumerate(ref.ids.tolist())}
        idx = np.array([pos.get(int(i), -1) for i in s.ids.tolist()], np.int64)
        ok = idx >= 0
        if ref.quantiles_ns.shape[1] == q and ok.any():
            stack[p, ok] = ref.quantiles_ns[idx[ok]]
    cons = np.nanmedian(stack, axis=0) if len(refs) else np.full((k, q), np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.log(np.maximum(s.quantiles_ns, 1.0) / np.maximum(cons, 1.0))
    mid = slice(q // 4, q - q // 4) if q >= 3 else slice(0, q)
    per_kernel = np.nanmedian(lr[:, mid], axis=1) if k else np.zeros(0)
    return per_kernel, lr


def _weighted(values: np.ndarray, w: np.ndarray) -> float:
    ok = np.isfinite(values) & (w > 0)
    return float(np.sum(values[ok] * w[ok]) / np.sum(w[ok])) if ok.any() else 0.0


def kernel_level(
    suspect: KernelStats,
    peers: Sequence[KernelStats],
    names: Mapping[int, str] | Sequence[str] | None = None,
    *,
    rank: int = -1,
    history: KernelStats | None = None,
    degraded_ratio: float = 1.15,
) -> KernelFinding:
    """Compare a suspect's kernel statistics with its peers' consensus.

    Args:
        suspect: the suspect rank's statistics for the step.
        peers: statistics of healthy peers of the same group, same step (ids must be the
            same dictionary: map them first if the ranks interned names differently).
        names: kernel id -> name, to tell NCCL kernels (``nccl*``) from compute and to
            name degraded kernels.
        rank: the suspect's rank, for the record.
        history: the suspect's own statistics from an earlier, healthy step.
        degraded_ratio: the per-call ratio from which a kernel counts as degraded.
    """
    per_kernel, lr = _log_ratios(suspect, peers)
    w = suspect.total_ns.astype(float)
    dist = _weighted(np.nanmean(np.abs(lr), axis=1) if len(lr) else np.zeros(0), w)
    is_nccl = np.array([_name(names, int(i)).lower().startswith("nccl") for i in suspect.ids.tolist()], bool)
    compute = float(np.exp(_weighted(np.where(~is_nccl, per_kernel, np.nan), w)))
    coll = float(np.exp(_weighted(np.where(is_nccl, per_kernel, np.nan), w)))
    peer_idle = [float(p.idle_ns.sum()) for p in peers]
    idle = float(suspect.idle_ns.sum()) / max(float(np.median(peer_idle)) if peer_idle else 0.0, 1.0)
    ratios = np.exp(per_kernel)
    bad = np.flatnonzero(np.isfinite(ratios) & (ratios >= degraded_ratio))
    bad = bad[np.argsort(-ratios[bad])]
    degraded = tuple((_name(names, int(suspect.ids[i])), round(float(ratios[i]), 4)) for i in bad.tolist())
    hist = float("nan")
    if history is not None:
        _, hlr = _log_ratios(suspect, [history])
        hist = _weighted(np.nanmean(np.abs(hlr), axis=1) if len(hlr) else np.zeros(0), w)
    return KernelFinding(rank, dist, compute, coll, idle, degraded, hist)
