"""Parallel layout from the frameworks: Megatron-Core's parallel_state and DeepSpeed's
topology (objects shaped like theirs: neither is installable here), the precedence of
explicit sizes, and the cupti-python / torch CUDA check."""

from __future__ import annotations

import sys
import types
from collections import namedtuple

from argus.producers.agent import deepspeed_layout, detect_rank_info, framework_layout, megatron_layout
from argus.producers.collectors.cupti import cupti_version_mismatch


def fake_parallel_state(dp: int, tp: int, pp: int, *, initialized: bool = True) -> types.ModuleType:
    """A module with Megatron-Core's parallel_state getters."""
    ps = types.ModuleType("megatron.core.parallel_state")
    ps.model_parallel_is_initialized = lambda: initialized  # type: ignore[attr-defined]
    ps.get_data_parallel_rank = lambda: dp  # type: ignore[attr-defined]
    ps.get_tensor_model_parallel_rank = lambda: tp  # type: ignore[attr-defined]
    ps.get_pipeline_model_parallel_rank = lambda: pp  # type: ignore[attr-defined]
    ps.get_expert_model_parallel_rank = lambda: 0  # type: ignore[attr-defined]

    def no_cp() -> int:
        raise AssertionError("context parallel group is not initialized")

    ps.get_context_parallel_rank = no_cp  # type: ignore[attr-defined]
    return ps


class ProcessTopology:
    """DeepSpeed's ProcessTopology: axes in order, the last varying fastest."""

    def __init__(self, axes: list[str], dims: list[int]) -> None:
        self.axes, self.dims = axes, dims
        self.ProcessCoord = namedtuple("ProcessCoord", axes)  # type: ignore[misc]

    def get_coord(self, rank: int) -> tuple[int, ...]:
        coord = []
        for d in reversed(self.dims):
            coord.append(rank % d)
            rank //= d
        return self.ProcessCoord(*reversed(coord))


class PipelineEngine:
    """What DeepSpeed's PipelineEngine exposes: ``grid`` holding ``_topo``."""

    def __init__(self, topo: ProcessTopology) -> None:
        self.grid = types.SimpleNamespace(_topo=topo)


def test_megatron_parallel_state_gives_the_coordinates(monkeypatch):
    assert megatron_layout(fake_parallel_state(3, 1, 2)) == {"dp": 3, "tp": 1, "pp": 2, "ep": 0}
    assert megatron_layout(fake_parallel_state(3, 1, 2, initialized=False)) == {}
    monkeypatch.setitem(sys.modules, "megatron.core.parallel_state", fake_parallel_state(3, 1, 2))
    found = framework_layout(None)
    assert found == ("megatron", {"dp": 3, "tp": 1, "pp": 2, "ep": 0})
    info = detect_rank_info("j", env={"RANK": "13", "WORLD_SIZE": "16"}, framework=found)
    assert (info.dp, info.tp, info.pp, info.layout) == (3, 1, 2, "megatron")
    # tp_size / pp_size stay overrides (Megatron's default order from the sizes)
    info = detect_rank_info(
        "j", env={"RANK": "13", "WORLD_SIZE": "16"}, framework=found, tp_size=2, pp_size=2
    )
    assert (info.dp, info.tp, info.pp, info.layout) == (2, 1, 1, "sizes")


def test_deepspeed_topology_from_the_engine_grid():
    topo = ProcessTopology(["pipe", "data", "model"], [2, 2, 2])  # PipeModelDataParallelTopology
    engine = PipelineEngine(topo)
    assert deepspeed_layout(engine, 5) == {"pp": 1, "dp": 0, "tp": 1}
    assert deepspeed_layout(topo, 6) == {"pp": 1, "dp": 1, "tp": 0}
    assert framework_layout(engine, rank=3) == ("deepspeed", {"pp": 0, "dp": 1, "tp": 1})
    # an mpu-style object (Megatron's mpu handed to DeepSpeed): its getters
    mpu = types.SimpleNamespace(
        get_data_parallel_rank=lambda: 4, get_pipe_parallel_rank=lambda: 1, get_slice_parallel_rank=lambda: 0
    )
    assert deepspeed_layout(types.SimpleNamespace(mpu=mpu), 0) == {"dp": 4, "pp": 1, "tp": 0}


def test_without_a_framework_every_rank_is_data_parallel_and_coords_override():
    assert framework_layout(object()) is None
    info = detect_rank_info("j", env={"RANK": "5", "WORLD_SIZE": "8"})
    assert (info.dp, info.tp, info.pp, info.layout) == (5, 0, 0, "default")
    info = detect_rank_info(
        "j", env={"RANK": "5", "WORLD_SIZE": "8"}, framework=("mesh", {"dp": 1, "tp": 1}), coords={"dp": 7}
    )
    assert (info.dp, info.tp, info.layout) == (7, 1, "coords")


def test_cupti_python_must_match_torch_cuda_major():
    assert cupti_version_mismatch("12.8", "12.9.1") == ""
    msg = cupti_version_mismatch("12.8", "13.4.0")
    assert "cupti-python 13.4.0" in msg and "CUDA 12.8" in msg and "gpu-cu12" in msg
    assert "\n" not in msg
    assert cupti_version_mismatch("", "13.0") == ""  # a CPU-only torch: nothing to match
