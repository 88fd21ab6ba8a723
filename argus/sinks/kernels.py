"""Kernel sketches → rows of the ``kernels`` table (the SQL-queryable side of the sketches).

Delta frames need their base step: the decoder keeps each rank's last decoded step and
name dictionary. A delta frame whose base it does not hold (the sink restarted, a message
is missing) yields no rows until the rank's next key frame; the payload itself is always
stored in ``kernel_sketches``, so nothing is lost, only not yet decoded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import numpy as np
import pyarrow as pa

from argus.schemas import DecodeError, KernelNames, KernelSketch, KernelStats
from argus.schemas.kernel_codec import CODEC_ID, decode_payload

__all__ = ["KernelDecoder", "kernel_table"]

log = logging.getLogger("argus.sink.kernels")

_Rank = tuple[str, int, int]


def kernel_table(sketch: KernelSketch, stats: KernelStats, names: Mapping[int, str]) -> pa.Table:
    """Rows of the ``kernels`` table for one decoded sketch."""
    q = stats.quantiles_at((0.5, 0.9, 0.99))
    k = len(stats)
    return pa.table(
        {
            "job": pa.array([sketch.job] * k, pa.string()),
            "run": pa.array(np.full(k, sketch.run), pa.uint32()),
            "rank": pa.array(np.full(k, sketch.rank), pa.uint32()),
            "step": pa.array(np.full(k, sketch.step), pa.uint64()),
            "kernel_id": pa.array(stats.ids, pa.uint32()),
            "name": pa.array([names.get(int(i), f"kernel#{int(i)}") for i in stats.ids], pa.string()),
            "count": pa.array(stats.count, pa.uint32()),
            "total_ns": pa.array(stats.total_ns, pa.uint64()),
            "p50_ns": pa.array(q[:, 0], pa.float32()),
            "p90_ns": pa.array(q[:, 1], pa.float32()),
            "p99_ns": pa.array(q[:, 2], pa.float32()),
            "max_ns": pa.array(stats.max_ns, pa.uint64()),
        }
    )


class KernelDecoder:
    """Stateful per-rank decoding of kernel sketches, in partition order."""

    def __init__(self, lookup_names: Callable[[_Rank], dict[int, str]] | None = None) -> None:
        self._base: dict[_Rank, tuple[int, KernelStats]] = {}
        self._names: dict[_Rank, dict[int, str]] = {}
        self._lookup = lookup_names
        self.undecodable = 0

    def names(self, record: KernelNames) -> None:
        """Learn a rank's dictionary entries."""
        self._names.setdefault((record.job, record.run, record.rank), {}).update(
            zip(record.ids, record.names, strict=True)
        )

    def decode(self, sketch: KernelSketch) -> pa.Table | None:
        """The ``kernels`` rows of a sketch, or None when it cannot be decoded (yet)."""
        key = (sketch.job, sketch.run, sketch.rank)
        base = None
        if sketch.base_step >= 0:
            held = self._base.get(key)
            if held is None or held[0] != sketch.base_step:
                self.undecodable += 1
                return None
            base = held[1]
        if sketch.codec != CODEC_ID:
            self.undecodable += 1
            return None
        try:
            stats = decode_payload(sketch.payload, base)
        except DecodeError as exc:
            self.undecodable += 1
            log.warning("kernel sketch %s rank %d step %d: %s", sketch.job, sketch.rank, sketch.step, exc)
            return None
        self._base[key] = (sketch.step, stats)
        if key not in self._names and self._lookup is not None:
            self._names[key] = self._lookup(key)
        return kernel_table(sketch, stats, self._names.get(key, {}))
