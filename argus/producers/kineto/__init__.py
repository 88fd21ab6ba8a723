"""The Kineto importer: PyTorch profiler traces (Chrome-trace JSON, one file per rank) →
the StepBatch, KernelNames and KernelSketch records a live rank would publish.

Streams the file (memory bounded by about two steps); every bad input is a
:class:`TraceError` that names the file.
"""

from __future__ import annotations

from ._errors import TraceError
from ._importer import ImportSummary, KinetoImport, collective_kind, phase_of
from ._reader import TraceReader

__all__ = ["ImportSummary", "KinetoImport", "TraceError", "TraceReader", "collective_kind", "phase_of"]
