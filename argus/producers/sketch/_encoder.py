"""The per-rank kernel-sketch encoder: delta frames against the previous step, key frames
every ``key_every`` steps so that a consumer that joins late or loses a message recovers."""

from __future__ import annotations

from argus.schemas import KernelSketch, KernelStats
from argus.schemas.kernel_codec import CODEC_ID, encode_payload, quantize

__all__ = ["RankSketchEncoder"]


class RankSketchEncoder:
    """Encode one rank's steps into ``KernelSketch`` records.

    A step is delta-coded against the previous *encoded* step (its quantized stats, exactly
    what the decoder holds) when that step is the immediately preceding one; otherwise, on
    every ``key_every``-th frame and for the first step, it is a key frame (``base_step=-1``).
    """

    def __init__(self, job: str, run: int, rank: int, *, key_every: int = 32) -> None:
        if key_every < 1:
            raise ValueError("key_every must be >= 1")
        self.job, self.run, self.rank = job, run, rank
        self.key_every = key_every
        self._prev: KernelStats | None = None
        self._prev_step = -1
        self._since_key = 0

    def encode(self, step: int, stats: KernelStats) -> KernelSketch:
        """The record of ``stats`` for ``step`` (a delta frame when the chain allows)."""
        delta = (
            self._prev is not None and step == self._prev_step + 1 and self._since_key < self.key_every - 1
        )
        base = self._prev if delta else None
        payload = encode_payload(stats, base)
        self._since_key = self._since_key + 1 if delta else 0
        self._prev = quantize(stats)
        self._prev_step = step
        return KernelSketch(
            self.job, self.run, self.rank, step, CODEC_ID, self._prev_step - 1 if delta else -1, payload
        )

    def force_key_frame(self) -> None:
        """Make the next frame a key frame (e.g. after a consumer asked to resync)."""
        self._prev = None
