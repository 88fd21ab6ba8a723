"""The stream workers (Faust): assemble steps, diagnose them live, publish anomalies."""

from __future__ import annotations

from .app import StreamConfig, StreamMetrics, build_app
from .assembly import AssemblyConfig, CompleteStep, StepAssembler, dense_world

__all__ = [
    "AssemblyConfig",
    "CompleteStep",
    "StepAssembler",
    "StreamConfig",
    "StreamMetrics",
    "build_app",
    "dense_world",
]
