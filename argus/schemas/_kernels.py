"""The decoded kernel activity of one rank in one step: the model the kernel codec
produces and the kernel-level detectors read (one model, like HTA's per-rank frame)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["KernelStats"]


@dataclass(frozen=True, eq=False)
class KernelStats:
    """Per-kernel statistics of one rank in one step, as parallel numpy arrays.

    ``ids`` are interned kernel-name ids (the rank's dictionary, see KernelNames);
    ``count`` and ``total_ns`` are exact; ``quantiles_ns[i, j]`` is kernel ``i``'s duration
    quantile at probability ``probs[j]``; ``stream_ids``/``idle_ns`` give the GPU idle time
    between kernels per stream.
    """

    ids: np.ndarray  # int32 (k,)
    count: np.ndarray  # int64 (k,)
    total_ns: np.ndarray  # int64 (k,)
    min_ns: np.ndarray  # int64 (k,)
    max_ns: np.ndarray  # int64 (k,)
    probs: np.ndarray  # float64 (q,)
    quantiles_ns: np.ndarray  # float64 (k, q)
    stream_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    idle_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __post_init__(self) -> None:
        k = len(self.ids)
        for name in ("count", "total_ns", "min_ns", "max_ns"):
            if len(getattr(self, name)) != k:
                raise ValueError(f"KernelStats.{name} has {len(getattr(self, name))} entries, ids {k}")
        if self.quantiles_ns.shape != (k, len(self.probs)):
            raise ValueError(f"quantiles_ns shape {self.quantiles_ns.shape} != ({k}, {len(self.probs)})")
        if len(self.stream_ids) != len(self.idle_ns):
            raise ValueError("stream_ids and idle_ns differ in length")

    def __len__(self) -> int:
        return len(self.ids)

    def quantiles_at(self, probs: Sequence[float] | np.ndarray) -> np.ndarray:
        """Every kernel's duration quantiles (ns) at ``probs``: shape (k, len(probs)).

        The one kernel-quantile function (sinks, detectors and the report read it): the
        piecewise-linear quantile function through ``(0, min)``, ``(p_j, q_j)`` for the
        stored probabilities and ``(1, max)``, made monotone.
        """
        want = np.clip(np.asarray(probs, np.float64), 0.0, 1.0)
        p = np.concatenate(([0.0], np.asarray(self.probs, np.float64), [1.0]))
        v = np.column_stack(
            [
                np.asarray(self.min_ns, np.float64),
                np.asarray(self.quantiles_ns, np.float64).reshape(len(self.ids), len(self.probs)),
                np.asarray(self.max_ns, np.float64),
            ]
        )
        v = np.maximum.accumulate(v, axis=1)
        j = np.clip(np.searchsorted(p, want, side="right") - 1, 0, len(p) - 2)
        span = p[j + 1] - p[j]
        w = np.divide(want - p[j], span, out=np.zeros_like(want), where=span > 0)
        out: np.ndarray = v[:, j] + w[None, :] * (v[:, j + 1] - v[:, j])
        return out
