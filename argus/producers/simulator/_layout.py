"""The parallel layout of a simulated job: ranks -> (pp, dp, cp, tp) coordinates -> hosts -> GPUs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = ["Layout"]


@dataclass(frozen=True)
class Layout:
    """A dp × tp × pp (× cp) job, ``gpus_per_host`` GPUs per host, Megatron rank order.

    Rank order: tp varies fastest, then cp, then dp, then pp (so a tp group sits on one
    host when ``tp`` divides ``gpus_per_host``). ``ep`` splits each dp group into expert
    groups (``ep`` coordinate = ``dp % ep``). Host ``h`` holds ranks
    ``h*gpus_per_host .. (h+1)*gpus_per_host - 1``.
    """

    dp: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    gpus_per_host: int = 8

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "ep", "gpus_per_host"):
            if getattr(self, name) < 1:
                raise ValueError(f"Layout.{name} must be >= 1")
        if self.dp % self.ep:
            raise ValueError("Layout.ep must divide dp")

    @property
    def n_ranks(self) -> int:
        """Number of ranks (GPUs) of the job."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def n_hosts(self) -> int:
        """Number of hosts (the last one may be partly used)."""
        return -(-self.n_ranks // self.gpus_per_host)

    @cached_property
    def coords(self) -> dict[str, np.ndarray]:
        """Per-rank coordinates: rank, tp, cp, dp, pp, ep, host (index), gpu (index on host)."""
        r = np.arange(self.n_ranks, dtype=np.int64)
        tp = r % self.tp
        cp = (r // self.tp) % self.cp
        dp = (r // (self.tp * self.cp)) % self.dp
        pp = r // (self.tp * self.cp * self.dp)
        return {
            "rank": r,
            "tp": tp,
            "cp": cp,
            "dp": dp,
            "pp": pp,
            "ep": dp % self.ep,
            "host": r // self.gpus_per_host,
            "gpu": r % self.gpus_per_host,
        }

    def rank_at(self, *, pp: int = 0, dp: int = 0, tp: int = 0, cp: int = 0) -> int:
        """The rank at the given coordinates."""
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    def host_of(self, rank: int) -> int:
        """Host index of a rank."""
        return rank // self.gpus_per_host

    def ranks_of_host(self, host: int) -> tuple[int, ...]:
        """Ranks on host index ``host``."""
        lo = host * self.gpus_per_host
        return tuple(range(lo, min(lo + self.gpus_per_host, self.n_ranks)))

    @staticmethod
    def host_name(host: int) -> str:
        """The host name the simulator gives host index ``host``."""
        return f"node-{host:05d}"
