"""Can the GPU libraries run here? One line of reason either way, never an exception."""

from __future__ import annotations

import ctypes.util

__all__ = ["cupti_probe", "nvml_probe"]


def nvml_probe() -> tuple[bool, str]:
    """Whether NVML (nvidia-ml-py) can read GPUs on this machine, and why not."""
    try:
        import pynvml
    except ImportError:
        return False, "nvidia-ml-py not installed: pip install 'argus-gpu[gpu]'"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
            return False, "libnvidia-ml.so not found: no NVIDIA driver on this machine"
        if isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
            return False, "the NVIDIA kernel driver is not loaded"
        return False, f"nvmlInit failed: {exc}"
    try:
        count = pynvml.nvmlDeviceGetCount()
        driver = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        return False, f"driver {driver} but no GPU visible"
    return True, f"{count} GPU(s), driver {driver}"


def cupti_probe() -> tuple[bool, str]:
    """Whether CUPTI (cupti-python) can trace kernels on this machine, and why not."""
    if ctypes.util.find_library("cuda") is None:
        return False, "libcuda.so not found: no NVIDIA driver on this machine"
    try:
        from cupti import cupti  # noqa: F401
    except ImportError:
        return False, "cupti-python not installed: pip install 'argus-gpu[gpu]'"
    except OSError as exc:
        return False, f"libcupti could not be loaded: {exc}"
    return True, "cupti-python loaded"
