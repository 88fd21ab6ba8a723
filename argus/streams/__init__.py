"""The stream workers (Faust): assemble steps, diagnose them live, publish anomalies."""

from __future__ import annotations

from .app import StreamConfig, Streams, build_app
from .assembly import AssemblyConfig, CompleteStep, StepAssembler
from .hangs import HangTracker
from .metrics import StreamMetrics
from .ordering import Reorderer

__all__ = [
    "AssemblyConfig",
    "CompleteStep",
    "HangTracker",
    "Reorderer",
    "StepAssembler",
    "StreamConfig",
    "StreamMetrics",
    "Streams",
    "build_app",
]
