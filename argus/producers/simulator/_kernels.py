"""A realistic kernel mix per step, turned into :class:`schemas.KernelStats` for one rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from argus.schemas import KernelNames, KernelStats

if TYPE_CHECKING:
    from ._cluster import SimStep

__all__ = ["KERNEL_NAMES", "PROBS", "column_factor", "kernel_factors", "kernel_names", "kernel_stats"]

# (name, step-record column it belongs to, share of that column, calls per step, spread)
_MIX: tuple[tuple[str, str, float, int, float], ...] = (
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas", "forward_ms", 0.55, 96, 0.08),
    ("flash_fwd_kernel", "forward_ms", 0.30, 32, 0.10),
    ("vectorized_elementwise_kernel", "forward_ms", 0.10, 200, 0.15),
    ("layer_norm_fwd_kernel", "forward_ms", 0.05, 64, 0.08),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize128x256x64_cublas", "backward_ms", 0.55, 192, 0.08),
    ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "backward_ms", 0.30, 32, 0.10),
    ("elementwise_kernel_with_index", "backward_ms", 0.15, 300, 0.15),
    ("multi_tensor_apply_kernel", "optimizer_ms", 1.0, 8, 0.05),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "all_reduce_ms", 1.0, 8, 0.10),
    ("ncclDevKernel_AllGather_RING_LL", "all_gather_ms", 1.0, 64, 0.10),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter_ms", 1.0, 64, 0.10),
    ("ncclDevKernel_SendRecv", "p2p_ms", 1.0, 32, 0.20),
    ("Memcpy HtoD (Pinned -> Device)", "h2d_ms", 1.0, 4, 0.05),
)
KERNEL_NAMES: tuple[str, ...] = tuple(m[0] for m in _MIX)
"""Kernel names; kernel id ``i`` is ``KERNEL_NAMES[i]`` on every simulated rank."""
PROBS = np.array([0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99])
_COMPUTE_COLUMNS = frozenset({"forward_ms", "backward_ms", "optimizer_ms"})
# standard normal quantiles of PROBS
_Z = np.array([-2.3263, -1.2816, -0.6745, 0.0, 0.6745, 1.2816, 2.3263])


_COLUMN = np.array([m[1] for m in _MIX], dtype=object)
_SHARE = np.array([m[2] for m in _MIX])


def kernel_factors(pattern: str, factor: float) -> np.ndarray:
    """Per-call duration factor of every kernel: ``factor`` for the kernels whose name
    contains ``pattern`` (case-insensitive), 1 for the others."""
    hit = np.array([pattern.lower() in n.lower() for n in KERNEL_NAMES])
    if not hit.any():
        raise ValueError(f"no simulated kernel matches {pattern!r}")
    return np.where(hit, factor, 1.0)


def column_factor(factors: np.ndarray, column: str) -> float:
    """How much slower a phase gets when its kernels run ``factors`` slower per call."""
    sel: np.ndarray = np.equal(_COLUMN, column)
    return float(np.sum(_SHARE[sel] * factors[sel]) / np.sum(_SHARE[sel])) if sel.any() else 1.0


def kernel_names(job: str, run: int, rank: int) -> KernelNames:
    """The kernel-name dictionary record a simulated rank sends once."""
    return KernelNames(job, run, rank, tuple(range(len(KERNEL_NAMES))), KERNEL_NAMES)


def kernel_stats(sim: SimStep, rank: int) -> KernelStats:
    """Kernel statistics of ``rank`` in ``sim``'s step.

    GPU truth: compute kernels run ``gpu_factor`` slower per call (throttled GPU, masked
    straggler, longer sequences), ``count_factor`` more often (more layers on a stage), and
    a rank's ``kernel_slow`` kernels that much slower each (their phase shares it);
    the all-reduce kernels of a slow link ``collective_factor`` slower; collective kernel
    time includes waiting for peers (NCCL kernels spin). Idle gaps grow with CPU stalls,
    and a CPU-starved rank's compute phases are longer by idle gaps (``gap_ms``), not by
    slower kernels.
    """
    b = sim.batch
    rng = np.random.default_rng([sim.seed, b.step, rank, 7])
    ranks = b["rank"]
    row = rank if rank < len(ranks) and ranks[rank] == rank else int(np.flatnonzero(ranks == rank)[0])
    compute_ms = float(b["forward_ms"][row] + b["backward_ms"][row] + b["optimizer_ms"][row])
    gap_ms = float(sim.gap_ms[row]) if sim.gap_ms is not None else 0.0
    hidden = (1.0 + float(sim.hidden_ms[row]) / max(compute_ms, 1e-9)) * (
        1.0 - gap_ms / max(compute_ms, 1e-9)
    )
    k = len(_MIX)
    count = np.zeros(k, np.int64)
    total = np.zeros(k)
    spread = np.zeros(k)
    slow = sim.kernel_slow.get(int(rank))
    for i, (_, col, share, calls, sd) in enumerate(_MIX):
        phase_ms = float(b[col][row])
        if col in _COMPUTE_COLUMNS:
            phase_ms *= hidden
            calls = round(calls * sim.count_factor[row])
        if slow is not None:
            phase_ms *= float(slow[i]) / column_factor(slow, col)
        count[i] = calls if phase_ms > 0 else 0
        total[i] = phase_ms * share * 1e6
        spread[i] = sd
    mean = np.divide(total, count, out=np.zeros(k), where=count > 0)
    jitter = 1.0 + 0.01 * np.clip(rng.standard_normal((k, len(PROBS))), -3, 3)
    q = mean[:, None] * np.exp(spread[:, None] * _Z[None, :] - spread[:, None] ** 2 / 2) * jitter
    q = np.sort(q, axis=1)
    keep = count > 0
    idle_ms = (
        float(b["dataloader_ms"][row] + b["gc_ms"][row] + b["compile_ms"][row] + b["checkpoint_ms"][row])
        + 0.02 * float(b["forward_ms"][row] + b["backward_ms"][row]) * float(sim.launch_factor[row])
        + gap_ms
    )
    return KernelStats(
        ids=np.flatnonzero(keep).astype(np.int32),
        count=count[keep],
        total_ns=total[keep].astype(np.int64),
        min_ns=(q[keep, 0] * 0.8).astype(np.int64),
        max_ns=(q[keep, -1] * 1.2).astype(np.int64),
        probs=PROBS.copy(),
        quantiles_ns=q[keep],
        stream_ids=np.array([7, 13], np.int32),
        idle_ns=np.array([int(idle_ms * 1e6), int(idle_ms * 0.5e6)], np.int64),
    )
