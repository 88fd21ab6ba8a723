"""Where this process sits in the job: rank, world, host and parallel coordinates.

Read from torch.distributed when it is initialized, else from the launcher's environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``TORCHELASTIC_RESTART_COUNT``); every value can
be overridden. Parallel coordinates follow Megatron's default order (tensor parallel
fastest, then data parallel, pipeline slowest) from the tp and pp sizes.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RankInfo", "coordinates", "detect_rank_info"]


@dataclass(frozen=True)
class RankInfo:
    """Identity of one training process."""

    job: str
    run: int
    rank: int
    world: int
    local_rank: int
    host: str
    gpu_uuid: str = ""
    dp: int = 0
    tp: int = 0
    pp: int = 0
    ep: int = 0
    cp: int = 0


def coordinates(rank: int, world: int, *, tp_size: int = 1, pp_size: int = 1) -> tuple[int, int, int]:
    """(dp, tp, pp) of ``rank`` with tensor parallel fastest and pipeline slowest."""
    if tp_size < 1 or pp_size < 1 or world % (tp_size * pp_size):
        raise ValueError(f"world {world} is not a multiple of tp {tp_size} × pp {pp_size}")
    dp_size = world // (tp_size * pp_size)
    return (rank // tp_size) % dp_size, rank % tp_size, rank // (tp_size * dp_size)


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, default))
    except ValueError:
        return default


def detect_rank_info(
    job: str,
    *,
    env: Mapping[str, str] | None = None,
    rank: int | None = None,
    world: int | None = None,
    run: int | None = None,
    host: str | None = None,
    gpu_uuid: str = "",
    tp_size: int = 1,
    pp_size: int = 1,
    coords: Mapping[str, int] | None = None,
) -> RankInfo:
    """The rank's identity: explicit values, then torch.distributed, then the environment."""
    env = os.environ if env is None else env
    dist_rank = dist_world = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist_rank, dist_world = dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    r = rank if rank is not None else dist_rank if dist_rank is not None else _int(env, "RANK", 0)
    w = world if world is not None else dist_world if dist_world is not None else _int(env, "WORLD_SIZE", 1)
    if not 0 <= r < max(w, 1):
        raise ValueError(f"rank {r} is outside a world of {w}")
    if world is None and w % (tp_size * pp_size):
        tp_size = pp_size = 1  # a layout that does not divide the world is ignored
    dp, tp, pp = coordinates(r, w, tp_size=tp_size, pp_size=pp_size)
    c = dict(coords or {})
    return RankInfo(
        job=job,
        run=run if run is not None else _int(env, "TORCHELASTIC_RESTART_COUNT", 0),
        rank=r,
        world=w,
        local_rank=_int(env, "LOCAL_RANK", 0),
        host=host or socket.gethostname(),
        gpu_uuid=gpu_uuid,
        dp=c.get("dp", dp),
        tp=c.get("tp", tp),
        pp=c.get("pp", pp),
        ep=c.get("ep", 0),
        cp=c.get("cp", 0),
    )
