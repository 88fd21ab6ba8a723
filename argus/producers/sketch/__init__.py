"""Kernel sketches on the rank: raw kernel events of a step → KernelStats → KernelSketch.

Pure and numpy-vectorized (no I/O): :func:`kernel_stats` builds the per-kernel statistics,
:class:`NameInterner` keeps the per-rank name dictionary, :class:`RankSketchEncoder` emits
delta-coded payloads with periodic key frames (codec in :mod:`schemas.kernel_codec`).
"""

from __future__ import annotations

from ._encoder import RankSketchEncoder
from ._names import NameInterner
from ._stats import ALL_STREAMS, kernel_stats, stream_idle

__all__ = ["ALL_STREAMS", "NameInterner", "RankSketchEncoder", "kernel_stats", "stream_idle"]
