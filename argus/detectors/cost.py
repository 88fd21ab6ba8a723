"""Cost of an anomaly: the step time it adds to the job and the GPU-hours lost."""

from __future__ import annotations

__all__ = ["excess_ms", "gpu_hours", "step_ms_added"]


def excess_ms(excess: float) -> float:
    """A suspect's excess over its group's median, uncut (none below it): its level and
    shape across steps, where its cost (:func:`step_ms_added`) stops at one step."""
    return max(float(excess), 0.0)


def step_ms_added(excess: float, job_step_ms: float) -> float:
    """Step time a suspect adds to a synchronous job: its excess over its group's median
    (what-if: the suspect at the median, everyone else waits for it), at most the step."""
    return min(excess_ms(excess), max(float(job_step_ms), 0.0))


def gpu_hours(added_ms: float, n_ranks: int) -> float:
    """GPU-hours one step with ``added_ms`` more wall time costs a job of ``n_ranks`` GPUs."""
    return max(added_ms, 0.0) * n_ranks / 3.6e6
