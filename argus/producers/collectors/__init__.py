"""Collectors: each observes one layer and turns what it sees into Argus records.

``cupti`` (GPU kernels into kernel sketches) and ``nvml`` (GPU health) are imported from
their modules; the probes say whether the GPU libraries can run here.
"""

from __future__ import annotations

from .gpu_probe import cupti_probe, nvml_probe

__all__ = ["cupti_probe", "nvml_probe"]
