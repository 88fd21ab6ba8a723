"""Collectors: each observes one layer and turns what it sees into Argus records."""

from __future__ import annotations

from .gpu_probe import cupti_probe, nvml_probe

__all__ = ["cupti_probe", "nvml_probe"]
