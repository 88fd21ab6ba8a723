"""Where this process sits in the job: rank, world, host and parallel coordinates.

Read from torch.distributed when it is initialized, else from the launcher's environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``TORCHELASTIC_RESTART_COUNT``); every value can
be overridden. Parallel coordinates come from the framework that owns the layout
(:func:`framework_layout`: a ``DeviceMesh`` and its dim names, Megatron-Core's
``parallel_state``, DeepSpeed's topology); explicit ``tp_size``/``pp_size`` override it and
follow Megatron's default order (tensor parallel fastest, then data parallel, pipeline
slowest); with neither, every rank is data parallel.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RankInfo",
    "coordinates",
    "deepspeed_layout",
    "detect_rank_info",
    "framework_layout",
    "megatron_layout",
    "mesh_layout",
]

log = logging.getLogger("argus.agent")

AXES = ("dp", "tp", "pp", "ep", "cp")
_AXIS_NAMES = {
    # a mesh / topology dim name -> our axis
    "dp": "dp",
    "data": "dp",
    "ddp": "dp",
    "fsdp": "dp",
    "hsdp": "dp",
    "replicate": "dp",
    "shard": "dp",
    "dp_replicate": "dp",
    "dp_shard": "dp",
    "dp_shard_cp": "dp",
    "tp": "tp",
    "tensor": "tp",
    "model": "tp",
    "mp": "tp",
    "slice": "tp",
    "pp": "pp",
    "pipe": "pp",
    "pipeline": "pp",
    "ep": "ep",
    "expert": "ep",
    "cp": "cp",
    "context": "cp",
}


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
    layout: str = "default"  # where dp/tp/pp came from: default, sizes, mesh, megatron, deepspeed


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
    tp_size: int | None = None,
    pp_size: int | None = None,
    coords: Mapping[str, int] | None = None,
    framework: tuple[str, Mapping[str, int]] | None = None,
) -> RankInfo:
    """The rank's identity: explicit values, then torch.distributed, then the environment.

    Parallel coordinates: ``coords`` per axis, else from ``tp_size``/``pp_size`` when given,
    else ``framework`` (a source name and its coordinates, :func:`framework_layout`), else
    every rank is data parallel.
    """
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
    sized = tp_size is not None or pp_size is not None
    tps, pps = tp_size or 1, pp_size or 1
    if world is None and w % (tps * pps):
        tps = pps = 1  # a layout that does not divide the world is ignored
    dp, tp, pp = coordinates(r, w, tp_size=tps, pp_size=pps)
    source = "sizes" if sized else "default"
    found: dict[str, int] = {}
    if framework is not None and not sized:
        source, found = framework[0], dict(framework[1])
        dp, tp, pp = found.get("dp", dp), found.get("tp", 0), found.get("pp", 0)
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
        ep=c.get("ep", found.get("ep", 0)),
        cp=c.get("cp", found.get("cp", 0)),
        layout="coords" if c else source,
    )


def _axis(name: str) -> str | None:
    return _AXIS_NAMES.get(name.lower().strip())


def mesh_layout(mesh: Any) -> dict[str, int]:
    """This rank's coordinates on a ``DeviceMesh`` by its dim names (``("dp", "tp")``,
    ``("dp_replicate", "dp_shard", "tp")``, ...). Several dims of one axis (HSDP's replicate
    and shard) combine row-major; a dim with an unknown name is ignored. Empty if this rank
    is not in the mesh or the mesh has no dim names."""
    try:
        from torch.distributed.device_mesh import _mesh_resources

        mesh = _mesh_resources.get_root_mesh(mesh) or mesh
    except Exception:
        pass
    names = getattr(mesh, "mesh_dim_names", None)
    coord = mesh.get_coordinate()
    if not names or coord is None:
        return {}
    shape = tuple(int(n) for n in mesh.mesh.shape)
    out: dict[str, int] = {}
    for name, index, size in zip(names, coord, shape, strict=True):
        axis = _axis(name)
        if axis is not None:
            out[axis] = out.get(axis, 0) * size + int(index)
    return out


def megatron_layout(parallel_state: Any) -> dict[str, int]:
    """Coordinates from Megatron-Core's ``parallel_state`` once model parallel is initialized."""
    ps = parallel_state
    if not ps.model_parallel_is_initialized():
        return {}
    getters = {
        "dp": "get_data_parallel_rank",
        "tp": "get_tensor_model_parallel_rank",
        "pp": "get_pipeline_model_parallel_rank",
        "ep": "get_expert_model_parallel_rank",
        "cp": "get_context_parallel_rank",
    }
    out = {}
    for axis, getter in getters.items():
        fn = getattr(ps, getter, None)
        if fn is not None:
            try:
                out[axis] = int(fn())
            except Exception:  # an axis this version or configuration does not set up
                continue
    return out


def deepspeed_layout(obj: Any, rank: int) -> dict[str, int]:
    """Coordinates from DeepSpeed: a ``ProcessTopology`` (``get_coord(rank)`` with axes such
    as ``pipe``, ``data``, ``model``), a ``PipelineParallelGrid`` (``_topo``), or an engine
    holding one (``.grid``, ``.mpu``)."""
    for attr in ("grid", "mpu"):
        inner = getattr(obj, attr, None)
        if inner is not None and inner is not obj:
            found = deepspeed_layout(inner, rank)
            if found:
                return found
    topo = getattr(obj, "_topo", None) or (obj if hasattr(obj, "get_coord") else None)
    if topo is not None:
        coord = topo.get_coord(rank)
        fields: Any = getattr(coord, "_fields", None) or getattr(topo, "axes", None) or ()
        out: dict[str, int] = {}
        for name, index in zip(fields, tuple(coord), strict=False):
            axis = _axis(str(name))
            if axis is not None:
                out[axis] = int(index)
        return out
    getters = {
        "dp": "get_data_parallel_rank",
        "pp": "get_pipe_parallel_rank",
        "tp": "get_slice_parallel_rank",
    }
    out = {}
    for axis, getter in getters.items():
        fn = getattr(obj, getter, None)
        if callable(fn):
            out[axis] = int(fn())
    return out


def _model_mesh(model: Any) -> Any:
    """The DeviceMesh of the model's first DTensor parameter (FSDP2, tensor parallel)."""
    params = getattr(model, "parameters", None)
    if params is None:
        return None
    for p in params():
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None:
            return mesh
    return None


def framework_layout(
    model: Any = None, mesh: Any = None, *, rank: int = 0
) -> tuple[str, dict[str, int]] | None:
    """Parallel coordinates from the framework that set them up, and which one it was.

    In order: ``mesh`` (a ``DeviceMesh``) or the mesh of the model's DTensor parameters;
    Megatron-Core's ``parallel_state`` if the job imported it; DeepSpeed's topology (from the
    model, a DeepSpeed engine, or ``deepspeed.utils.groups`` if imported). None if none knows.
    Nothing is imported that the job did not import.
    """
    candidates: list[tuple[str, Any]] = []
    if mesh is None and model is not None:
        try:
            mesh = _model_mesh(model)
        except Exception:
            mesh = None
    if mesh is not None:
        candidates.append(("mesh", lambda: mesh_layout(mesh)))
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is not None:
        candidates.append(("megatron", lambda: megatron_layout(ps)))
    if model is not None and (hasattr(model, "grid") or hasattr(model, "mpu")):
        candidates.append(("deepspeed", lambda: deepspeed_layout(model, rank)))
    groups = sys.modules.get("deepspeed.utils.groups")
    grid = getattr(groups, "mpu", None) if groups is not None else None
    if grid is not None:
        candidates.append(("deepspeed", lambda: deepspeed_layout(grid, rank)))
    for source, find in candidates:
        try:
            found = find()
        except Exception as exc:
            log.info("argus: parallel layout from %s unavailable: %s", source, exc)
            continue
        if found:
            return source, found
    return None
