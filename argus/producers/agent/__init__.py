"""The rank agent: framework hooks, Python stack sampling, step records, heartbeats.

Built by ``argus.attach`` (the public API lives in ``argus/api.py``); this package only
knows ``schemas`` and a sink with ``publish(topic, key, record)``.
"""

from __future__ import annotations

from ._agent import AgentConfig, RankAgent, Sink
from ._hooks import COLLECTIVE_KINDS, GroupState, Instrumentation, tensor_bytes
from ._layout import (
    RankInfo,
    coordinates,
    deepspeed_layout,
    detect_rank_info,
    framework_layout,
    megatron_layout,
    mesh_layout,
)
from ._spans import COLUMNS, CpuClock, CudaClock, RawStep, SpanRecorder, exclusive_ms, reduce_step
from ._stacks import StackFolder, StackWindow

__all__ = [
    "COLLECTIVE_KINDS",
    "COLUMNS",
    "AgentConfig",
    "CpuClock",
    "CudaClock",
    "GroupState",
    "Instrumentation",
    "RankAgent",
    "RankInfo",
    "RawStep",
    "Sink",
    "SpanRecorder",
    "StackFolder",
    "StackWindow",
    "coordinates",
    "deepspeed_layout",
    "detect_rank_info",
    "exclusive_ms",
    "framework_layout",
    "megatron_layout",
    "mesh_layout",
    "reduce_step",
    "tensor_bytes",
]
