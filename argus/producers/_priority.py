"""Telemetry threads yield the CPU to training: a lower OS scheduling priority for the calling thread."""

from __future__ import annotations

import os
import threading

__all__ = ["BACKGROUND_NICE", "yield_cpu_to_training"]

BACKGROUND_NICE = 10
"""How much nicer than the training process the agent's and the publisher's threads run."""


def yield_cpu_to_training(step: int = BACKGROUND_NICE) -> bool:
    """Raise the calling thread's nice value by ``step`` (Linux: nice is per thread), so a
    training thread, a data-loader worker or a communication backend's thread that becomes
    runnable preempts it. On a host whose cores are all busy, a telemetry thread holding a
    core delays the backend thread that finishes a collective, and the training thread waits
    for that. Lowering one's own priority needs no privilege. Returns whether it was done."""
    if not hasattr(os, "setpriority"):
        return False
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + step))
    except OSError:
        return False
    return True
