"""Kernel level, only for suspects: a rank's kernel statistics against the cross-rank
consensus of its peers (and optionally its own history), as a distribution distance.

Quantiles are read at fixed probabilities through :meth:`KernelStats.quantiles_at` (the
one kernel-quantile function), so ranks whose sketches store different probabilities
still compare; ids must be one dictionary (:func:`common_ids` maps per-rank ones).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from argus.schemas import KernelStats

__all__ = ["PROBES", "DegradedKernel", "KernelFinding", "common_ids", "kernel_family", "kernel_level"]

PROBES = np.array([0.1, 0.25, 0.5, 0.75, 0.9])
"""Probabilities the kernel level compares at (the middle three decide a kernel's ratio)."""
_P90 = 4
_MID = slice(1, 4)

_NCCL = re.compile(r"nccl(?:DevKernel|Kernel)?_?([A-Za-z]+)", re.IGNORECASE)
_FAMILIES: tuple[tuple[str, str], ...] = (
    ("split_embedding", "split_embedding"),
    ("embedding", "embedding"),
    ("gemm", "gemm"),
    ("gemv", "gemm"),
    ("cutlass", "gemm"),
    ("xmma", "gemm"),
    ("flash", "flash_attention"),
    ("attention", "attention"),
    ("softmax", "softmax"),
    ("layer_norm", "layer_norm"),
    ("layernorm", "layer_norm"),
    ("conv", "convolution"),
    ("multi_tensor_apply", "optimizer"),
    ("memcpy", "memcpy"),
    ("memset", "memset"),
    ("elementwise", "elementwise"),
    ("reduce", "reduce"),
)


def kernel_family(name: str) -> str:
    """The family a kernel name belongs to, as a person would say it: ``gemm`` for cuBLAS /
    CUTLASS matrix multiplies, ``nccl:AllReduce`` for NCCL kernels (per collective),
    ``split_embedding`` for FBGEMM's embedding kernels, ``flash_attention``, ...; else the
    name's first identifier (template arguments and signatures dropped)."""
    low = name.lower()
    if low.startswith("nccl"):
        m = _NCCL.match(name)
        op = m.group(1) if m else ""
        return f"nccl:{op}" if op else "nccl"
    for needle, family in _FAMILIES:
        if needle in low:
            return family
    head = re.split(r"[<(\s]", name.strip(), maxsplit=1)[0]
    return head.rsplit("::", 1)[-1][:64] or "kernel"


@dataclass(frozen=True)
class DegradedKernel:
    """One kernel that runs slower per call on the suspect than on its peers: its p50 and
    p90 duration ratios to the peers' consensus and the time it adds (suspect's total
    time of the kernel less what it would take at the peers' per-call speed), ns."""

    name: str
    family: str
    p50_ratio: float
    p90_ratio: float
    excess_ns: float


@dataclass(frozen=True)
class KernelFinding:
    """How one rank's kernels differ from its peers'.

    ``distance``: time-weighted mean |log| ratio of the rank's duration quantiles to the
    peers' consensus (element-wise median); ``compute_ratio``/``collective_ratio``:
    time-weighted geometric mean per-call duration ratio of compute / NCCL kernels;
    ``idle_ratio``: the rank's GPU idle time over the peers' median; ``degraded``: kernels
    whose per-call ratio reaches the threshold and whose added time counts, the most
    added time first; ``history_distance``: the same distance against the rank's own
    earlier statistics (nan without history).
    """

    rank: int
    distance: float
    compute_ratio: float
    collective_ratio: float
    idle_ratio: float
    degraded: tuple[DegradedKernel, ...]
    history_distance: float = float("nan")

    @property
    def families(self) -> tuple[str, ...]:
        """The degraded kernels' families, most added time first, each once."""
        return tuple(dict.fromkeys(d.family for d in self.degraded))

    def evidence(self) -> dict[str, float]:
        """The figures as Anomaly evidence entries: the ratios, then per degraded family
        (two at most) ``kernel_family:<family>`` (its p50 ratio) and per degraded kernel
        ``kernel:<name>`` (p50 ratio) and ``kernel_p90:<name>`` (p90 ratio)."""
        ev = {
            "kernel_distance": round(self.distance, 4),
            "kernel_compute_ratio": round(self.compute_ratio, 4),
            "kernel_collective_ratio": round(self.collective_ratio, 4),
            "kernel_idle_ratio": round(self.idle_ratio, 4),
        }
        if np.isfinite(self.history_distance):
            ev["kernel_history_distance"] = round(self.history_distance, 4)
        for fam in self.families[:2]:
            top = next(d for d in self.degraded if d.family == fam)
            ev[f"kernel_family:{fam}"] = round(top.p50_ratio, 4)
        for d in self.degraded[:2]:
            ev[f"kernel:{d.name[:120]}"] = round(d.p50_ratio, 4)
            ev[f"kernel_p90:{d.name[:120]}"] = round(d.p90_ratio, 4)
        return ev

    def describe(self) -> str:
        """One line for the anomaly's summary (empty when nothing degraded)."""
        if not self.degraded:
            return ""
        parts = [
            f"{d.family} p50 x{d.p50_ratio:.2f} p90 x{d.p90_ratio:.2f} ({d.name[:80]})"
            for d in self.degraded[:2]
        ]
        return "slow kernels: " + "; ".join(parts) + f"; GPU idle x{self.idle_ratio:.2f}"


def _name(names: Mapping[int, str] | Sequence[str] | None, kid: int) -> str:
    if names is None:
        return str(kid)
    try:
        return str(names[kid])
    except (KeyError, IndexError):
        return str(kid)


def _consensus(s: KernelStats, refs: Sequence[KernelStats]) -> np.ndarray:
    """Per kernel of ``s``: the refs' element-wise median quantiles at :data:`PROBES` (nan
    where no ref has the kernel), shape (k, len(PROBES))."""
    k = len(s.ids)
    stack = np.full((len(refs), k, len(PROBES)), np.nan)
    for p, ref in enumerate(refs):
        if not len(ref.ids):
            continue
        order = np.argsort(ref.ids, kind="stable")
        sorted_ids = ref.ids[order]
        at = np.clip(np.searchsorted(sorted_ids, s.ids), 0, len(sorted_ids) - 1)
        ok = sorted_ids[at] == s.ids
        if ok.any():
            stack[p, ok] = ref.quantiles_at(PROBES)[order[at[ok]]]
    if not len(refs):
        return np.full((k, len(PROBES)), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a kernel no peer has: nan, as meant
        out: np.ndarray = np.nanmedian(stack, axis=0)
    return out


def _log_ratios(s: KernelStats, refs: Sequence[KernelStats]) -> np.ndarray:
    """Log ratio of ``s``'s quantiles to the refs' consensus, shape (k, len(PROBES))."""
    cons = _consensus(s, refs)
    with np.errstate(divide="ignore", invalid="ignore"):
        out: np.ndarray = np.log(np.maximum(s.quantiles_at(PROBES), 1.0) / np.maximum(cons, 1.0))
    return out


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
    min_excess: float = 0.02,
) -> KernelFinding:
    """Compare a suspect's kernel statistics with its peers' consensus.

    Args:
        suspect: the suspect rank's statistics (one step, or merged steps).
        peers: statistics of healthy peers of the same group, same steps (ids must be the
            same dictionary: :func:`common_ids` maps per-rank ones).
        names: kernel id -> name, to tell NCCL kernels (``nccl*``) from compute and to
            name degraded kernels.
        rank: the suspect's rank, for the record.
        history: the suspect's own statistics from an earlier, healthy step.
        degraded_ratio: the per-call ratio (median over p25..p75) from which a kernel
            counts as degraded.
        min_excess: ... and the share of the suspect's kernel time it adds, at least.

    Notes:
        A kernel slower per call on one GPU than on its peers is that GPU's (or link's)
        doing; NCCL kernels also spin while waiting for peers, so a straggler's peers show
        *longer* collectives: only ratios above 1 count as degraded.
    """
    lr = _log_ratios(suspect, peers)
    # rows are all-finite or all-NaN (a kernel the peers lack): the median keeps the NaN
    per_kernel = np.median(lr[:, _MID], axis=1) if len(lr) else np.zeros(0)
    w = suspect.total_ns.astype(float)
    dist = _weighted(np.nanmean(np.abs(lr), axis=1) if len(lr) else np.zeros(0), w)
    kernel_names = [_name(names, int(i)) for i in suspect.ids.tolist()]
    is_nccl = np.array([n.lower().startswith("nccl") for n in kernel_names], bool)
    compute = float(np.exp(_weighted(np.where(~is_nccl, per_kernel, np.nan), w)))
    coll = float(np.exp(_weighted(np.where(is_nccl, per_kernel, np.nan), w)))
    peer_idle = [float(p.idle_ns.sum()) for p in peers]
    idle = float(suspect.idle_ns.sum()) / max(float(np.median(peer_idle)) if peer_idle else 0.0, 1.0)
    ratios = np.exp(per_kernel)
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.where(np.isfinite(ratios) & (ratios > 0), w * (1.0 - 1.0 / ratios), 0.0)
    total = max(float(w.sum()), 1.0)
    bad = np.flatnonzero(np.isfinite(ratios) & (ratios >= degraded_ratio) & (excess >= min_excess * total))
    bad = bad[np.argsort(-excess[bad], kind="stable")]
    p90 = np.exp(lr[:, _P90]) if len(lr) else np.zeros(0)
    degraded = tuple(
        DegradedKernel(
            kernel_names[i],
            kernel_family(kernel_names[i]),
            round(float(ratios[i]), 4),
            round(float(p90[i]), 4),
            float(excess[i]),
        )
        for i in bad.tolist()
    )
    hist = float("nan")
    if history is not None:
        hlr = _log_ratios(suspect, [history])
        hist = _weighted(np.nanmean(np.abs(hlr), axis=1) if len(hlr) else np.zeros(0), w)
    return KernelFinding(rank, dist, compute, coll, idle, degraded, hist)


def common_ids(
    stats: Mapping[int, KernelStats], names: Mapping[int, Mapping[int, str]]
) -> tuple[dict[int, KernelStats], list[str]]:
    """Per-rank statistics re-keyed to one dictionary (kernel names → ids shared by all the
    ranks), and that dictionary's names by id. A rank without a name for an id keeps it
    as ``kernel#<id>`` (ranks that intern alike, as the simulator's, still line up)."""
    table: dict[str, int] = {}
    out: dict[int, KernelStats] = {}
    for rank, s in stats.items():
        own = names.get(rank, {})
        ids = np.array(
            [table.setdefault(own.get(int(i), f"kernel#{int(i)}"), len(table)) for i in s.ids.tolist()],
            np.int32,
        )
        out[rank] = dataclasses.replace(s, ids=ids)
    return out, list(table)
